"""The lanes of one stream job, started together and watched until the job stops.

* delivery: micro-batches (``skyfilter/delivery/micro_batches.py``), or Real-time Mode
  for the brokers it can serve (``skyfilter/delivery/realtime.py``) with micro-batches
  beside it for the others;
* archive: its own queries, checkpoints and slower triggers: the input topic to
  ``alerts`` (``skyfilter/archive/alerts_lane.py``), the delivery log to ``matches``,
  ``metrics`` and ``broker_visits`` (``skyfilter/archive/log_lane.py``).

Each lane's jobs run in their own FAIR scheduler pool (``conf/fairscheduler.xml``),
and the archive's queries run in a bounded number of tasks (``archive.tasks``),
so a delivery batch always finds its task slots free (``skyfilter/plan/slots.py``).  The lanes
share one plan (filters, brokers, schemas) through a cell that reload, quarantine and new
input schema versions swap new plans into.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from skyfilter.archive.alerts_lane import ArchiveLane
from skyfilter.archive.log_lane import ArchiveLogLane
from skyfilter.archive.process import ArchiveProcess
from skyfilter.archive.writer_query import archived_offsets, logged_log_offsets, start_log_writer, start_writer
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LaneName
from skyfilter.delivery.caps import VisitCaps
from skyfilter.delivery.micro_batches import V1_SOURCES_WITHOUT_KAFKA, DeliveryLane
from skyfilter.delivery.realtime import RealtimeLane
from skyfilter.delivery.realtime_reads import marked_reads, reader_name, watch_realtime_reads
from skyfilter.delivery.realtime_split import broker_refusal, split_line
from skyfilter.delivery.realtime_start import rehearse, wait_until_reading, warm_up
from skyfilter.jobs.stop_signals import StopSignals
from skyfilter.kafka.clients import spark_sink_options, spark_source_options
from skyfilter.kafka.topics import ensure_topics, topic_partitions
from skyfilter.lanes.delivery_log import SummaryWriter, delivered_so_far
from skyfilter.lanes.kafka_reachability import InputArrivals, KafkaWatch, offsets_past_checkpoint
from skyfilter.lanes.lane import LaneServices, between_batches
from skyfilter.lanes.lane_failures import failure_line, is_spark_55271
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.totals import StreamTotals
from skyfilter.local.processes import write_whole
from skyfilter.local.status import status_file
from skyfilter.plan.quarantine import Quarantine
from skyfilter.plan.reload import PlanReloader
from skyfilter.plan.run_plan import RunPlan
from skyfilter.plan.slots import check_realtime_slots, delivery_tasks, local_cores
from skyfilter.plan.starting_offsets import for_topics
from skyfilter.plan.stream_plan import PlanCell, StreamPlan
from skyfilter.plan.triggers import trigger_keywords
from skyfilter.spark.session import scheduler_pool

logger = logging.getLogger(__name__)

STOP_BETWEEN_BATCHES_S = 20.0  # how long a stop waits for the micro-batches under way to finish
INPUT_CHECK_SECONDS = 2.0  # how often the main loop looks for new input schema versions for Real-time Mode


class StreamJob:
    """Starts the lanes of a stream, keeps its status file current, and stops them."""

    def __init__(self, spark: SparkSession, cfg: Config, run_plan: RunPlan, plan: StreamPlan):
        self.spark = spark
        self.cfg = cfg
        self.run_plan = run_plan  # what this run decided before it started (skyfilter/plan/run_plan.py)
        self.plan = plan  # as the job started: its name, topic, tables and checkpoints never change
        self.cell = PlanCell(plan)  # the plan in force: reload, quarantine and new input schemas swap it
        self.triggers = run_plan.triggers
        self.slots = run_plan.slots
        # the lanes this process runs: an archive in a process of its own is that process's
        self.lanes = run_plan.lanes - {LaneName.ARCHIVE} if run_plan.archive_apart else run_plan.lanes
        self.totals = StreamTotals()
        self.monitor = StreamMonitor(cfg, plan.name, plan.topic)
        self.services = LaneServices(spark, cfg, self.cell, spark_sink_options(cfg), self.monitor, self.totals)
        self.queries: dict[str, StreamingQuery] = {}
        self.realtime: RealtimeLane | None = None
        self.summaries: SummaryWriter | None = None
        self.reloader: PlanReloader | None = None
        self.archive: ArchiveLane | None = None
        self.archive_log: ArchiveLogLane | None = None
        self.archive_process: ArchiveProcess | None = None
        self.archive_unfinished = False  # the archive process ended before archiving everything delivered
        self.delivery: DeliveryLane | None = None
        self.triggered: dict[str, str] = {}  # micro-batch lane -> the trigger its query was started with
        self.recovered: set[str] = set()
        self.inputs_checked_at = time.monotonic()
        self.signals = StopSignals()  # the first SIGTERM/SIGINT asks wait() for a clean stop
        self.kafka = KafkaWatch(cfg)  # from start() on, so an outage is reported whatever the job waits for

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Start every lane asked for; the delivery lanes after the archive's tables exist."""
        self.signals.catch()
        self.kafka.start()
        self._ensure_input_topic()
        self.summaries = SummaryWriter(self.cfg, self.plan.delivery_log_topic)
        if LaneName.DELIVERY in self.lanes:
            self.monitor.follow(self.plan.delivery_log_topic)
        if LaneName.ARCHIVE in self.lanes:
            self.archive = ArchiveLane(self.services, self.triggers.archive, self.summaries)
            self.archive_log = ArchiveLogLane(self.services, self.triggers.archive_log)
            self.archive.prepare()
        if LaneName.DELIVERY in self.lanes:
            self._start_delivery()
        if self.archive is not None and not self.triggers.available_now:
            self._start_archive(self.triggers.archive, self.triggers.archive_log)
        if self.realtime is not None and not wait_until_reading(self.realtime):
            logger.warning("realtime: the Real-time Mode tasks had not started 120 s after the query did")
        if self.monitor.url:
            logger.info(f"metrics at {self.monitor.url}")

    def watch_archive_process(self, process: ArchiveProcess) -> None:
        """The archive lane runs in ``process``: its lag is measured here too, it is restarted if it dies, and it
        is stopped (and drains) after delivery stops."""
        self.archive_process = process
        self._watch_archive(f"{self.triggers.archive} (process {process.pid})", self.triggers.archive_log)

    def _watch_archive(self, trigger: str, log_trigger: str) -> None:
        """Measure the lag of the archive's two queries (the input topic, the delivery log)."""
        delta_rs = self.run_plan.archive_writer == "delta-rs"
        self.monitor.add_lane(LaneName.ARCHIVE, self.plan.lane_checkpoint(LaneName.ARCHIVE), trigger,
                              committed=archived_offsets(self.plan) if delta_rs else None)
        self.monitor.add_lane(LaneName.ARCHIVE_LOG, self.plan.lane_checkpoint(LaneName.ARCHIVE_LOG), log_trigger,
                              self.plan.delivery_log_topic, logged_log_offsets(self.plan) if delta_rs else None)

    def _start_delivery(self) -> None:
        cfg = self.cfg
        self.spark.conf.set(*V1_SOURCES_WITHOUT_KAFKA)
        quarantine = Quarantine(self.spark, cfg, self.cell)
        plan = self.cell.current  # without the filters an earlier run quarantined
        if cfg.stream.hot_reload:
            self.reloader = PlanReloader(self.spark, cfg, self.cell, cfg.path("stream.filters_dir"),
                                         cfg.path("stream.brokers"), quarantine.held_off)
        realtime = self.run_plan.realtime
        local_master = local_cores(self.spark.sparkContext.master) is not None
        settings = cfg.stream.realtime
        if realtime:
            self._check_slots()
            self.reader = reader_name(self.spark, plan.name, local_master)
            logger.info(split_line(plan, settings))
            source = marked_reads(self.spark, self.reader, self._source(LaneName.REALTIME).load())
            reads = watch_realtime_reads(self.spark, self.cfg, self.monitor, self.plan,
                                         self.triggers.realtime_interval, self.reader)
            self.realtime = RealtimeLane(self.services, source, reads, self.triggers.realtime_interval,
                                         self.summaries, quarantine, local_master)
            with scheduler_pool(self.spark, LaneName.REALTIME):
                warm_up(self.realtime)
                rehearse(self.realtime, self.reader,
                         lambda topic, starting: self._source(LaneName.REALTIME, [topic], starting).load())
                self.queries[LaneName.REALTIME] = self.realtime.start()
        needs_batches = not realtime or any(broker_refusal(b, plan, settings)
                                            for b in plan.brokers if b.enabled_filters)
        if not needs_batches:
            return
        caps = VisitCaps()
        caps.restore(delivered_so_far(self.spark, cfg, plan.delivery_log_topic, LaneName.DELIVERY,
                                      plan.lane_checkpoint(LaneName.DELIVERY)))
        label = "0s" if realtime else self.triggers.delivery
        self.delivery = DeliveryLane(
            self.services, label, self.summaries, caps,
            serves=(lambda broker, now: broker_refusal(broker, now, settings) is not None)
            if realtime else (lambda broker, now: True),
            dead_letters=not realtime, quarantine=quarantine, reloader=self.reloader,
            tasks=delivery_tasks(cfg, int(self.spark.sparkContext.defaultParallelism), self.slots))
        if not self.triggers.available_now:  # a warm-up serves the first visit's latency; a drain has none
            self.delivery.warm_up()
        self.monitor.add_lane(LaneName.DELIVERY, plan.lane_checkpoint(LaneName.DELIVERY), label)
        self._start_batches(LaneName.DELIVERY, label)

    def _start_archive(self, trigger: str, log_trigger: str) -> list[StreamingQuery]:
        """Start the archive lane's two queries: the input topic to ``alerts``, the delivery log to the rest."""
        self._watch_archive(trigger, log_trigger)
        return [self._start_batches(LaneName.ARCHIVE, trigger), self._start_batches(LaneName.ARCHIVE_LOG, log_trigger)]

    def _lane_function(self, lane: str):
        """(foreachBatch function, topics, bound on offsets per batch, tasks per batch) of a micro-batch query."""
        if lane == LaneName.DELIVERY:
            return self.delivery, None, int(self.cfg.stream.max_offsets_per_trigger), self.delivery.tasks
        bound = int(self.cfg.archive.max_offsets_per_trigger)
        if lane == LaneName.ARCHIVE:
            return self.archive, self.archive.topics, bound, max(self.slots.archive, 1)
        return self.archive_log, self.archive_log.topics, bound, 1

    def _start_batches(self, lane: str, trigger: str) -> StreamingQuery:
        """Start (or restart) the micro-batch query of the delivery lane or of one of the archive's queries.

        Each batch runs in at most the lane's number of tasks: the input has one
        partition per Kafka partition, and a task per partition would cost each
        small batch one task start per partition and let the archive take every slot.
        """
        if lane in (LaneName.ARCHIVE, LaneName.ARCHIVE_LOG) and self.run_plan.archive_writer == "delta-rs":
            start = start_writer if lane == LaneName.ARCHIVE else start_log_writer
            query = self.queries[lane] = start(self.cfg, self.cell.current, trigger, self.monitor,
                                               self.totals.count_line)
            self.triggered[lane] = trigger
            return query
        batch_function, topics, bound, tasks = self._lane_function(lane)
        source = self._source(lane, topics).option("maxOffsetsPerTrigger", bound).load().coalesce(tasks)
        with scheduler_pool(self.spark, LaneName.ARCHIVE if lane == LaneName.ARCHIVE_LOG else lane):
            query = (source.writeStream.queryName(f"skyfilter_{lane}_{self.plan.name}").foreachBatch(batch_function)
                     .option("checkpointLocation", str(self.plan.lane_checkpoint(lane)))
                     .trigger(**trigger_keywords(trigger)).start())
        self.queries[lane] = query
        self.triggered[lane] = trigger
        return query

    def _recover(self, lane: str, exc: BaseException) -> StreamingQuery | None:
        """Restart a query that stopped for a reason it can resume from; else None.

        The Real-time query stops on an input schema version it did not know
        (:meth:`RealtimeLane.recover_new_schema`).  A micro-batch lane may hit Spark's
        Kafka progress bug: after a crash, the batch that was planned but not
        committed runs again from the checkpoint; it completes and commits, then the
        Kafka source fails reporting its progress (SPARK-55271: its latest offsets
        were never fetched in this run).  Restarting resumes after that committed batch.
        """
        if lane == LaneName.REALTIME and self.realtime is not None:
            query = self.realtime.recover_new_schema(exc)
            if query is not None:
                self.queries[LaneName.REALTIME] = query
            return query
        if lane in self.recovered or lane not in self.triggered or not is_spark_55271(exc):
            return None
        self.recovered.add(lane)
        self.monitor.restarted(lane)
        logger.warning(f"{lane} lane: Spark failed reporting the progress of the batch recovered from its "
                       f"checkpoint (SPARK-55271); that batch is committed, so the lane restarts after it")
        return self._start_batches(lane, self.triggered[lane])

    def _source(self, lane: str, topics: list[str] | None = None, starting: str | None = None):
        """A Kafka source reader of the lane: its topics, from the configured starting offsets (or ``starting``)."""
        options = spark_source_options(self.cfg)
        if lane == LaneName.REALTIME:  # long-polling: a fetch returns when data comes, and costs nothing while idle
            options["kafka.fetch.max.wait.ms"] = str(self.cfg.stream.realtime.fetch_max_wait_ms)
        topics = topics or [self.plan.topic]
        reader = (self.spark.readStream.format("kafka").options(**options).option("subscribe", ",".join(topics))
                  .option("startingOffsets", starting or for_topics(str(self.cfg.stream.starting_offsets), topics)))
        return reader

    def _ensure_input_topic(self) -> None:
        """Create the input topic if its schema was registered before it was created (Spark's Kafka source fails
        on a topic that does not exist yet)."""
        if not topic_partitions(self.cfg, self.plan.topic):
            ensure_topics(self.cfg, {self.plan.topic: self.cfg.topics.alerts_partitions})

    def _check_slots(self) -> None:
        partitions = topic_partitions(self.cfg, self.plan.topic)
        check_realtime_slots(int(self.spark.sparkContext.defaultParallelism),
                             dataclasses.replace(self.slots, realtime=partitions), self.plan.topic)

    # ----------------------------------------------------------------- run
    def run_available_now(self) -> None:
        """Process what the topic holds now: delivery first, then the archive of it all."""
        if LaneName.DELIVERY in self.queries:
            self._await(LaneName.DELIVERY, self.queries[LaneName.DELIVERY])
        if self.archive is not None:
            self._drain_archive()

    def _drain_archive(self) -> None:
        """Archive what the topic and the delivery log hold now: the alerts first (their figures go to the
        log), then the log."""
        self._watch_archive("availableNow", "availableNow")
        self._await(LaneName.ARCHIVE, self._start_batches(LaneName.ARCHIVE, "availableNow"))
        self._await(LaneName.ARCHIVE_LOG, self._start_batches(LaneName.ARCHIVE_LOG, "availableNow"))

    def _await(self, lane: str, query: StreamingQuery) -> None:
        while True:
            try:
                query.awaitTermination()
                failed = query.exception()
            except Exception as exc:  # noqa: BLE001 - StreamingQueryException and py4j errors alike
                failed = exc
            if failed is None:
                return
            query = self._recover(lane, failed)
            if query is None:
                raise self.failure(lane, failed)

    def wait(self, idle_s: float | None) -> None:
        """Block until a lane fails, a signal comes, Kafka is away too long, or every lane has been idle long enough.

        On an idle stop and on SIGTERM/SIGINT the delivery lanes stop first, then the archive catches up with
        everything they delivered before the job ends, so a clean stop leaves a complete archive.
        """
        status = status_file(self.cfg, self.plan.name, archive_only=self.lanes == {LaneName.ARCHIVE})
        status.parent.mkdir(parents=True, exist_ok=True)
        context = self.spark.sparkContext
        about = {"pid": os.getpid(), "topic": self.plan.topic, "started_at": time.time(), "status": "running",
                 "trigger": self.triggers.delivery, "checkpoint": str(self.plan.checkpoint),
                 "master": context.master, "application_id": context.applicationId, "metrics_url": self.monitor.url,
                 "query_ids": {lane: str(q.id) for lane, q in self.queries.items()},
                 "archive_pid": self.archive_process.pid if self.archive_process else None}
        self.signals.catch()
        arrivals = InputArrivals(self.cfg, self.plan.topic, offsets_past_checkpoint(
            self.cfg, self.plan.lane_checkpoint(LaneName.REALTIME), self.plan.topic)) \
            if self.realtime is not None and idle_s else None
        drain = False
        try:
            while self.queries:
                self.monitor.tick({lane: query.isActive for lane, query in self.queries.items()},
                                  kafka_down=self.kafka.down_since is not None)
                write_whole(status, json.dumps(about | self.monitor.snapshot | {"totals": self.totals.as_dict()},
                                               default=str))
                if not self._poll(0.5):
                    break
                self._reload_realtime()
                if self.archive_process is not None:
                    self.archive_process.check()
                outage = self.kafka.over_limit()
                if outage is not None:
                    raise outage
                if self.signals.received is not None:
                    logger.info(f"stopping on signal {signal.Signals(self.signals.received).name}" + (
                                ": the archive catches up with what was delivered (the same signal again stops at once)"
                        if self.archive is not None or self.archive_process is not None else ""))
                    drain = True
                    break
                # the idle clock runs from the first alert this run reads: a stream started before its night waits
                last_input = max(self.totals.last_input_at, arrivals.last_growth() if arrivals else 0.0)
                if idle_s is not None and last_input and self._idle() and self.kafka.down_since is None \
                        and time.time() - max(last_input, self.kafka.back_at) > idle_s:
                    logger.info(f"no new alerts for {idle_s:.0f} s: stopping")
                    drain = True
                    break
        finally:
            if arrivals is not None:
                arrivals.close()
            self.signals.second_stops_at_once(archive_only=self.lanes == {LaneName.ARCHIVE})
            try:
                if drain and self.realtime is not None and self.kafka.down_since is None:
                    self.realtime.deliver_what_came(STOP_BETWEEN_BATCHES_S)
                self.stop()
                if self.archive_process is not None:
                    self.archive_unfinished = self.archive_process.stop(self.cfg.archive.stop_timeout_s) != 0
                status.unlink(missing_ok=True)
                if drain and self.archive is not None:
                    self._drain_archive()
            finally:
                self.signals.restore()

    def _poll(self, seconds: float) -> bool:
        """Wait on every query for a while; False once one stopped without an error (someone stopped it).

        A failed query is restarted when it hit SPARK-55271 (see :meth:`_recover`), else its error is raised.
        """
        for lane, query in list(self.queries.items()):
            try:
                query.awaitTermination(seconds / len(self.queries))
                failed = None if query.isActive else query.exception()
            except Exception as exc:  # noqa: BLE001 - StreamingQueryException and py4j errors alike
                failed = exc
            if failed is not None and self._recover(lane, failed) is None:
                raise self.failure(lane, failed)
            if failed is None and not query.isActive:
                return False
        return True

    def _reload_realtime(self) -> None:
        """Hot reload and new input schema versions for Real-time Mode: between its batches the micro-batch lane
        looks for them; here the main loop does (the query restarts to take them)."""
        if self.realtime is None:
            return
        self.realtime.review_filter_errors()
        if self.reloader is not None and self.reloader.check():
            self.realtime.restart_at_checkpoint = False  # an edit is taken at once
        if time.monotonic() - self.inputs_checked_at > INPUT_CHECK_SECONDS:
            self.inputs_checked_at = time.monotonic()
            self.realtime.refresh_inputs()
        if self.realtime.restart_if_changed():
            self.queries[LaneName.REALTIME] = self.realtime.query

    def _idle(self) -> bool:
        """No micro-batch query has data waiting or a trigger under way (a Real-time query always runs one)."""
        for lane, query in self.queries.items():
            if lane == LaneName.REALTIME:
                continue
            state = query.status
            if state.get("isDataAvailable", False) or state.get("isTriggerActive", False):
                return False
        return True

    def stop(self) -> None:
        """Stop every query: the delivery lanes first, then the archive.

        A micro-batch query is stopped between two batches: the batch under way
        finishes and commits, and no next one is planned, so the next start has
        nothing to recover and no task is interrupted while it writes.
        """
        if self.realtime is not None:
            self.realtime.close()
            self.realtime.stop()
        deadline = time.monotonic() + STOP_BETWEEN_BATCHES_S
        for lane in (LaneName.REALTIME, LaneName.DELIVERY, LaneName.ARCHIVE, LaneName.ARCHIVE_LOG):
            query = self.queries.pop(lane, None)
            if query is not None and query.isActive:
                if lane != LaneName.REALTIME and not between_batches(query, deadline):
                    logger.info(f"{lane} lane: its batch was still running {STOP_BETWEEN_BATCHES_S:.0f} s after the "
                                f"stop began: stopped in it (the next start runs it again)")
                query.stop()

    def close(self) -> None:
        """Stop the Kafka watch, the metrics endpoint and the summary producer; give SIGTERM/SIGINT their
        handlers back."""
        self.kafka.stop()
        if self.summaries is not None:
            self.summaries.close()
        self.monitor.close()
        self.signals.restore()

    def failure(self, lane: str, exc: BaseException) -> SkyfilterError:
        """One line for the user; the whole error goes to a log file next to the status file."""
        return failure_line(self.plan.name, lane, exc, self.cfg.run_dir / f"filter_stream.{self.plan.name}.error.log")
