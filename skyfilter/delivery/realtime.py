"""The delivery lane in Spark's Real-time Mode (``--trigger realtime``): each alert delivered as it arrives.

Real-time Mode runs one long-lived task per input partition that reads,
filters and writes each record as it comes, instead of planning a micro-batch
every time; its trigger duration is how often progress is checkpointed, not a
latency.  PySpark 4.2 starts it with the public ``trigger(realTime=...)``.

It serves every broker:

* SQL filters run in the tasks' compiled code;
* Python filters, and watchlist and watchmap matching, run in filter workers
  beside the JVM that runs each task (the driver on a local master, every
  executor on a cluster), called alert by alert by the tasks' own code
  (``skyfilter/filtering/filter_workers.py``): Spark's pandas UDFs would hold
  every answer until the checkpoint in Real-time Mode.  A
  filter that raises, hangs or returns the wrong length is off at once in the
  worker where it failed, heard by the driver through the delivery log
  (``skyfilter/filtering/filter_errors.py``) and quarantined; the query restarts
  without it at its next checkpoint, so nothing is sent twice;
* per-visit caps are decided by the stream's visit cap ledger
  (``skyfilter/spark/jvm/VisitCapLedger.java``): the first matches of a visit
  to arrive, across partitions, executors and restarts.

The ledger lives in the driver's JVM; on a cluster the executors' tasks ask it
over TCP (``VisitCapLedger.serve``), one round trip per capped match.

``stream.realtime.python_filters`` and ``stream.realtime.caps`` (both on by
default) send those brokers to micro-batches instead.  The split is printed
when the stream starts.  Delivery is at-least-once: a restarted query resends
what it wrote since its last checkpoint (caps still hold: the ledger admits
the same alerts again).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.figures import FilterReports
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.core.lane_names import LaneName
from skyfilter.delivery.batch_figures import figure_aggregates, read_matches
from skyfilter.delivery.caps import realtime_broker_visits, realtime_cap_step
from skyfilter.delivery.micro_batches import batch_stats, report_batch, summary_record
from skyfilter.delivery.program import encode_and_narrow_steps, evaluate, lane_filters
from skyfilter.delivery.realtime_reads import RealtimeReads
from skyfilter.delivery.realtime_split import broker_refusal
from skyfilter.delivery.realtime_start import WARM_UP_LEDGER, wait_until_reading, warm_up
from skyfilter.filtering.filter_errors import KIND as FILTER_ERROR_KIND
from skyfilter.filtering.filter_errors import FilterErrorWatch, error_record
from skyfilter.filtering.filter_eval import FilterSet, worker_filter_set
from skyfilter.filtering.filter_workers import filter_set, watch_set
from skyfilter.filtering.input_schemas import NEW_SCHEMA_ERROR
from skyfilter.kafka.lag import LatestOffsets
from skyfilter.lanes.delivery_log import RESTORE_HOURS, SummaryWriter
from skyfilter.lanes.lane import Lane, LaneServices
from skyfilter.plan.outgoing import message_steps, with_batch_id
from skyfilter.plan.quarantine import Quarantine
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA, PROBE_ALERTS, StreamPlan
from skyfilter.plan.triggers import duration
from skyfilter.spark.internals import (
    announce_query_stop,
    close_visit_caps,
    open_visit_caps,
    register_jvm_function,
    serve_visit_caps,
    visit_cap_counts,
)
from skyfilter.spark.steps import apply_steps
from skyfilter.watch.columns import template_columns, used_by, watch_down_report

logger = logging.getLogger(__name__)

LANE = LaneName.REALTIME
OBSERVATION = "skyfilter_realtime"
FILTER_ERROR_KEY = "filter_error"  # key of the delivery-log records of failing Python filters
SINK_SETTLE_S = 1.0  # a read alert passes the filters and reaches Kafka in milliseconds; a stop leaves it 1 s


class RealtimeLane(Lane):
    """The Real-time Mode query of a stream, restarted when what it serves changes."""

    def __init__(self, services: LaneServices, source: DataFrame, reads: RealtimeReads, interval: str,
                 summaries: SummaryWriter, quarantine: Quarantine | None = None, local_master: bool = True):
        super().__init__(services, LANE)
        self.source = source
        self.reads = reads
        self.interval = interval
        self.summaries = summaries
        self.quarantine = quarantine
        self.local_master = local_master
        self.query: StreamingQuery | None = None
        self.served: tuple = ()
        self.ledger: str | None = None  # the visit cap ledger open for the query (None: no capped broker)
        self.errors: FilterErrorWatch | None = None
        self.run_id = uuid.uuid4().hex  # names this run's filter sets in the workers, which outlive it
        self.restart_at_checkpoint = False  # a quarantine waits for the next checkpoint to restart the query
        self.checkpoint_passed = threading.Event()
        self.listener = _ProgressListener(self)
        self.spark.streams.addListener(self.listener)

    def brokers(self, plan: StreamPlan | None = None) -> list[BrokerSpec]:
        """The brokers this lane delivers to under ``plan`` (by default the plan its query runs)."""
        plan = plan or self.plan
        return [b for b in plan.brokers
                if b.enabled_filters and broker_refusal(b, plan, self.cfg.stream.realtime) is None]

    def signature(self, plan: StreamPlan) -> tuple:
        """What a query of ``plan`` is built from: input schemas, brokers, their filters and the filters' files."""
        digests = {spec.name: spec.digest for spec in plan.filters}
        watched = plan.watch.chosen(used_by(lane_filters(plan, self.brokers(plan))))
        return (tuple(sorted(plan.inputs.readable)), tuple(sorted(plan.inputs.reasons)),
                tuple((v.kind, v.name, v.version) for v in watched),
                *((b.delivery, tuple(digests.get(f) for f in b.enabled_filters)) for b in self.brokers(plan)))

    def rows(self, source: DataFrame, ledger: str, observed: bool = True, warm_up: bool = False) -> DataFrame:
        """The Kafka rows (broker topics, dead letters, delivery log) of the input rows ``source``.

        Capped brokers' matches are admitted by the visit cap ledger ``ledger``.  The
        figures are observed after the re-encodings, on rows without the decoded alert's
        fields (:func:`~skyfilter.delivery.program.encode_and_narrow_steps`).
        """
        brokers, plan = self.brokers(), self.plan
        filters = lane_filters(plan, brokers)
        evaluated = evaluate(plan, source, brokers, realtime=True, workers=self._filter_set(filters, warm_up),
                             watch_workers=self._watch_set(filters, warm_up))
        if any(b.max_alerts_per_visit is not None for b in brokers):
            register_jvm_function(self.spark, "VisitCapLedger")
        decided = with_batch_id(apply_steps(evaluated, [realtime_cap_step(brokers, ledger)]), -1)
        encoded = apply_steps(decided, encode_and_narrow_steps(plan, brokers, decided=True))
        if observed:
            encoded = encoded.observe(OBSERVATION, *figure_aggregates(filters, brokers))
        errors = ((FILTER_ERROR_KEY, error_record(LANE)),) if _python(filters) else ()
        if used_by(filters):
            errors += ((FILTER_ERROR_KEY, error_record(LANE, watch_down_report(filters))),)
        return apply_steps(encoded, message_steps(brokers, plan.encodings, plan.deadletter_topic,
                                                  plan.delivery_log_topic, LANE, plan.inputs.readable,
                                                  log_values=errors))

    def _filter_set(self, filters: list[FilterSpec], warm_up: bool = False) -> FilterSet | None:
        """The set of these filters' Python ones, for the filter workers of the JVMs that run the query's tasks;
        a warm-up's is a set of its own: what fails on probe alerts (their reports go nowhere) is still tried,
        and reported, on the night's."""
        python = [spec for spec in filters if spec.kind == "python"]
        if not python:
            return None
        template = self.plan.decode(self.spark.createDataFrame([], KAFKA_SOURCE_SCHEMA)) \
            .withColumns(template_columns(self.plan.watch))
        register_jvm_function(self.spark, "PythonFilterCall")
        return filter_set(*worker_filter_set(python, template), self.plan.filter_time_budget_s,
                          self._set_id(warm_up))

    def _watch_set(self, filters: list[FilterSpec], warm_up: bool = False) -> FilterSet | None:
        """The set of the watchlists and watchmaps these filters use, for the watch workers (a warm-up's is
        a set of its own, as in :meth:`_filter_set`)."""
        versions = self.plan.watch.chosen(used_by(filters))
        if not versions:
            return None
        register_jvm_function(self.spark, "PythonFilterCall")
        return watch_set([v.for_workers() for v in versions], self._set_id(warm_up))

    def _set_id(self, warm_up: bool) -> str:
        return f"{self.run_id}{WARM_UP_LEDGER if warm_up else ''}"

    def ledger_file(self, suffix: str = "") -> Path:
        return self.cfg.run_dir / f"filter_stream.{self.plan.name}.visit-caps{suffix}.ledger"

    def start(self, interval: str | None = None) -> StreamingQuery:
        """Start the query on the plan in force (resuming from its checkpoint); ``interval``: other than the lane's."""
        self.take_plan()
        brokers = self.brokers()
        self._open_ledger(any(b.max_alerts_per_visit is not None for b in brokers))
        filters = lane_filters(self.plan, brokers)
        if (_python(filters) or used_by(filters)) and self.errors is None and self.monitor.follower is not None:
            self.errors = FilterErrorWatch()
            self.monitor.follower.on(FILTER_ERROR_KIND, self.errors.heard)
        rows = self.rows(self.source, self.ledger_address(self.ledger) if self.ledger else "")
        self.query = (rows.writeStream.format("kafka").options(**self.kafka_options)
                      .queryName(f"skyfilter_{LANE}_{self.plan.name}")
                      .option("checkpointLocation", str(self.plan.lane_checkpoint(LANE))).outputMode("update")
                      .trigger(realTime=duration(interval or self.interval)).start())
        self.served = self.signature(self.plan)
        self.restart_at_checkpoint = False
        return self.query

    def _open_ledger(self, capped: bool) -> None:
        """Open the stream's visit cap ledger (once per run: its file keeps what earlier runs admitted)."""
        if capped and self.ledger is None:
            self.ledger = self.plan.name
            admitted = open_visit_caps(self.spark, self.ledger, str(self.ledger_file()), RESTORE_HOURS)
            logger.info(f"realtime: visit caps from the ledger {self.ledger_file()} ({admitted} admission(s) of the "
                        f"last {RESTORE_HOURS} h read back)")

    def ledger_address(self, ledger: str) -> str:
        """The ledger as the query's tasks reach it: by name in the driver's JVM on a local master, else over TCP
        from the executors (the driver serves it at ``spark.driver.host``)."""
        if self.local_master:
            return ledger
        return serve_visit_caps(self.spark, ledger, self.spark.conf.get("spark.driver.host"))

    def review_filter_errors(self) -> None:
        """Quarantine the Python filters the query reported failing since the last look (main loop).

        They are already off in the workers where they failed; the query restarts
        without them right after its next checkpoint (:meth:`restart_if_changed`).
        """
        if self.errors is None or self.quarantine is None:
            return
        failed = {name: report for name, report in self.errors.drain().items() if report["error"]}
        if not failed:
            return
        running = self.query.lastProgress["batchId"] + 1 if self.query is not None and self.query.lastProgress \
            else 0
        reports = FilterReports(errors={name: r["error"] for name, r in failed.items()},
                                samples={name: r["sample"] for name, r in failed.items() if r["sample"]})
        if self.quarantine.review(running, reports):
            self.monitor.show_quarantined(self.quarantine.quarantined(),
                                          [spec.name for spec in self.plan.filters])
            self.restart_at_checkpoint = True
            self.checkpoint_passed.clear()
            logger.warning(f"realtime: the query goes on without them from its next checkpoint (within "
                           f"{self.interval}); until then they are off in the Python workers where they failed")

    def restart_if_changed(self) -> bool:
        """After a reload, a quarantine or a new input schema version: restart the query when what it serves
        changed (after a quarantine, only once a checkpoint has just passed)."""
        if self.query is None or self.signature(self.cell.current) == self.served:
            return False
        if self.restart_at_checkpoint and not self.checkpoint_passed.is_set():
            return False
        logger.info(f"realtime: restarting the Real-time Mode query for "
                    f"{', '.join(b.name for b in self.brokers(self.cell.current))} "
                    f"(filters, brokers or input schemas changed)")
        self.restart()
        return True

    def restart(self) -> StreamingQuery:
        """Start the query again from its checkpoint, warmed up (what it sent since then is sent again)."""
        self.take_plan()
        warm_up(self, PROBE_ALERTS)  # beside the running query: its JVM is warm, the new plan's code is not loaded
        self.stop()
        self.start()
        self.monitor.restarted(LANE)
        wait_until_reading(self)
        return self.query

    def recover_new_schema(self, failure: BaseException) -> StreamingQuery | None:
        """Restart a query that stopped on an input schema id it did not know, once the id is settled; else None.

        The query cannot read the registry between records, so an alert of a version
        registered after it started stops it (``skyfilter/filtering/decode.py``).  The lane then reads
        the registry: the version is decoded from then on, or its alerts are dead-lettered
        with the reason, and the query resumes from its last checkpoint.
        """
        found = re.search(rf"{re.escape(NEW_SCHEMA_ERROR)} (\d+)", str(failure))
        if found is None:
            return None
        schema_id = int(found.group(1))
        self.refresh_inputs(seen=[schema_id])
        if schema_id not in self.cell.current.inputs.known:  # settled here, or by a micro-batch lane before
            return None
        logger.info(f"realtime: alerts of input schema id {schema_id} arrived: restarting the Real-time Mode query")
        return self.restart()

    def progress(self, progress) -> None:
        """One finished Real-time batch (every checkpoint interval): its figures to the log, metrics and totals."""
        self.checkpoint_passed.set()
        observed = (progress.observedMetrics or {}).get(OBSERVATION)
        if observed is None or not observed["input_alerts"]:
            return
        finished = time.time()
        started = finished - progress.batchDuration / 1000.0
        brokers = self.brokers()
        filters = lane_filters(self.plan, brokers)
        observed = observed.asDict()
        matches = read_matches(observed, filters, brokers)
        decision = realtime_broker_visits(visit_cap_counts(self.spark, self.ledger) if self.ledger else [], brokers)
        dropped = {name: n for name, n in decision.dropped_by_broker.items() if n}
        sent = {name: n - dropped.get(name, 0) for name, n in matches.by_broker.items()}
        stats = batch_stats(observed, None, filters, matches, sent, dropped, sum(sent.values()))
        quarantined = self.quarantine.quarantined() if self.quarantine is not None else []
        figures = self.monitor.batch_figures(LANE, progress.batchId, started, finished, stats.input_alerts,
                                             quarantined)
        self.summaries.write(summary_record(self.plan, LANE, self.monitor.run_id, progress.batchId,
                                            f"realtime {self.interval}", (started, None, finished), stats,
                                            figures, [row._asdict() for row in decision.rows]))
        self.monitor.observe_delivery(LANE, progress.batchId, stats, figures, started, None, finished,
                                      [f.name for f in filters])
        self.totals.add_delivery(stats, started, finished)
        report_batch(LANE, progress.batchId, stats, self.plan.deadletter_topic, started, None)

    def deliver_what_came(self, timeout_s: float) -> bool:
        """Before a clean stop: wait (at most ``timeout_s``) until the tasks have read to where the topic ends
        now, then :data:`SINK_SETTLE_S` for what they read to pass the filters and reach Kafka; False (said)
        when they had not read that far, or Kafka did not say where it ends (the next start delivers the rest)."""
        latest = LatestOffsets(self.cfg)
        try:
            ends = latest(self.plan.topic)
        except SkyfilterError:
            return False
        finally:
            latest.close()
        deadline = time.monotonic() + timeout_s
        while not self.reads.reached(ends):
            if time.monotonic() >= deadline or self.query is None or not self.query.isActive:
                logger.info(f"{LANE} lane: had not read every alert that came before the stop {timeout_s:.0f} s "
                            f"later: the next start delivers the rest (from its checkpoint)")
                return False
            time.sleep(0.1)
        time.sleep(SINK_SETTLE_S)
        return True

    def stop(self) -> None:
        """Stop the query; the alerts its tasks read since its last checkpoint (their read marks) are noted in
        the totals (its figures come at checkpoints).  Its long-lived tasks are killed: what they log of it goes
        to the log file only (``skyfilter/spark/jvm/ExpectedCancellations.java``)."""
        if self.query is None or not self.query.isActive:
            return
        self.totals.after_checkpoint = self.reads.past_checkpoint()
        announce_query_stop(self.spark, str(self.query.runId))
        self.query.stop()

    def close(self) -> None:
        """Stop listening for progress and filter errors; close the visit cap ledger (its file stays)."""
        self.spark.streams.removeListener(self.listener)
        if self.ledger is not None:
            close_visit_caps(self.spark, self.ledger)
            self.ledger = None


def _python(filters: list) -> bool:
    return any(spec.kind == "python" for spec in filters)


class _ProgressListener(StreamingQueryListener):
    """Hands the Real-time query's progress events to its lane (Spark calls this on its listener thread)."""

    def __init__(self, lane: RealtimeLane):
        self.lane = lane

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        query = self.lane.query
        if query is not None and str(event.progress.id) == str(query.id):
            try:
                self.lane.progress(event.progress)
            except SkyfilterError as exc:  # the summary could not be logged: say so, the query goes on
                logger.info(f"realtime batch {event.progress.batchId}: {exc}")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
