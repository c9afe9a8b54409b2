"""The delivery lane in Spark's Real-time Mode (``--trigger realtime``): each alert delivered as it arrives.

Real-time Mode (Spark 4.1) runs one long-lived task per input partition that
reads, filters and writes each record as it comes, instead of planning a
micro-batch every time; its trigger duration is how often progress is
checkpointed, not a latency.  PySpark 4.1 has no keyword for it: the JVM
trigger ``Trigger.RealTime`` is set on the writer's JVM object.

What it can serve, in Spark 4.1: stateless queries on a Kafka source and sink,
without Python UDFs.  So a broker is delivered in Real-time Mode when all its
filters are SQL and it has no per-visit cap (a cap needs state across
records); every other broker is served by the micro-batch delivery lane beside
it (``skyfilter/stream/delivery_lane.py``), which also reads the topic.  The split is
printed when the stream starts.  Delivery is at-least-once: a restarted query
resends what it wrote since its last checkpoint.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from skyfilter.core.brokers import BrokerSpec, load_brokers
from skyfilter.core.errors import SkyfilterError
from skyfilter.stream.batch_figures import figure_aggregates, read_matches
from skyfilter.stream.delivery_lane import batch_stats, report_batch, summary_record
from skyfilter.stream.delivery_log import SummaryWriter
from skyfilter.stream.delivery_program import encode_and_narrow_steps, evaluate, lane_filters
from skyfilter.stream.input_schemas import NEW_SCHEMA_ERROR
from skyfilter.stream.lane import Lane, LaneServices
from skyfilter.stream.outgoing import keep_every_match, message_steps, with_batch_id
from skyfilter.stream.steps import apply_steps
from skyfilter.stream.stream_plan import StreamPlan, probe_batch
from skyfilter.stream.triggers import seconds

LANE = "realtime"
REALTIME_TRIGGER = "realtime"
OBSERVATION = "skyfilter_realtime"
SHORTEST_INTERVAL = "5 seconds"  # Spark's spark.sql.streaming.realTimeMode.minBatchDuration
FIRST_BOUNDARY_AHEAD_FROM_S = 30.0  # checkpoint intervals from which the first boundary is passed at start-up


def realtime_refusal(broker: BrokerSpec, plan: StreamPlan) -> str | None:
    """Why a broker cannot be delivered in Real-time Mode (None when it can)."""
    kinds = {spec.name: spec.kind for spec in plan.filters}
    python = [name for name in broker.enabled_filters if kinds.get(name) == "python"]
    reasons = []
    if broker.max_alerts_per_visit is not None:
        reasons.append(f"max_alerts_per_visit {broker.max_alerts_per_visit}")
    if python:
        reasons.append(f"Python filter(s) {', '.join(python)}")
    return "; ".join(reasons) or None


def auto_trigger(filters_dir: Path, brokers_file: Path) -> tuple[str, str]:
    """``--trigger auto``: (trigger, why) - ``realtime`` when Real-time Mode can serve every broker, else ``0``.

    Read from the files alone, before Spark starts (its master depends on it).
    """
    kinds = {path.stem: path.suffix for path in filters_dir.glob("*") if path.suffix in (".sql", ".py")}
    misfits = []
    for broker in load_brokers(brokers_file):
        python = [f for f in broker.filters if kinds.get(f) == ".py"]
        if broker.max_alerts_per_visit is not None or python:
            misfits.append(broker.name)
    if not misfits:
        return REALTIME_TRIGGER, "every broker has SQL filters and no cap: Real-time Mode"
    return "0", (f"broker(s) {', '.join(misfits)} need micro-batches (a per-visit cap or a Python filter): "
                 f"micro-batches back to back")


def split_line(plan: StreamPlan) -> str:
    """One line saying which brokers go in Real-time Mode and which in micro-batches, and why."""
    live = [b for b in plan.brokers if b.enabled_filters]
    fast = [b.name for b in live if realtime_refusal(b, plan) is None]
    slow = [f"{b.name} ({realtime_refusal(b, plan)})" for b in live if realtime_refusal(b, plan) is not None]
    line = f"realtime: {len(fast)} of {len(live)} broker(s) in Real-time Mode" + (f": {', '.join(fast)}" if fast
                                                                                     else "")
    if slow:
        line += f"; in micro-batches beside it (Real-time Mode has no state and no Python): {', '.join(slow)}"
    return line


class RealtimeLane(Lane):
    """The Real-time Mode query of a stream, restarted when what it serves changes."""

    def __init__(self, services: LaneServices, source: DataFrame, interval: str, summaries: SummaryWriter):
        super().__init__(services, LANE)
        self.source = source
        self.interval = interval
        self.summaries = summaries
        self.query: StreamingQuery | None = None
        self.served: tuple = ()
        self.listener = _ProgressListener(self)
        self.spark.streams.addListener(self.listener)

    def brokers(self, plan: StreamPlan | None = None) -> list[BrokerSpec]:
        """The brokers this lane delivers to under ``plan`` (by default the plan its query runs)."""
        plan = plan or self.plan
        return [b for b in plan.brokers if b.enabled_filters and realtime_refusal(b, plan) is None]

    def signature(self, plan: StreamPlan) -> tuple:
        """What a query of ``plan`` is built from: input schemas, brokers, their filters and the filters' files."""
        digests = {spec.name: spec.digest for spec in plan.filters}
        return (tuple(sorted(plan.inputs.known)),
                *((b.name, b.topic, b.format, b.encoding, tuple((f, digests.get(f)) for f in b.enabled_filters))
                  for b in self.brokers(plan)))

    def _rows(self, source: DataFrame, observed: bool = True) -> DataFrame:
        """The Kafka rows (broker topics, dead letters, delivery log) of the input rows ``source``.

        The figures are observed after the re-encodings, on rows without the decoded alert's
        fields (:func:`~skyfilter.stream.delivery_program.encode_and_narrow_steps`).
        """
        brokers, plan = self.brokers(), self.plan
        decided = with_batch_id(keep_every_match(evaluate(plan, source, brokers, unknown_fails=True), brokers), -1)
        encoded = apply_steps(decided, encode_and_narrow_steps(plan, brokers, decided=True))
        if observed:
            encoded = encoded.observe(OBSERVATION, *figure_aggregates(lane_filters(plan, brokers), brokers))
        return apply_steps(encoded, message_steps(brokers, plan.encodings, plan.deadletter_topic,
                                                  plan.delivery_log_topic, LANE, plan.inputs.readable))

    def warm_up(self) -> None:
        """Run the query's code once on probe alerts, and load the Kafka clients, before the long-lived tasks start.

        Spark caches generated code by its text and the JVM compiles what ran often, so
        the Real-time tasks find the decoding and filtering compiled, and the Kafka
        clients' classes loaded, instead of the first visit waiting for them.
        """
        probe = probe_batch(self.spark, self.plan)
        self._rows(probe, observed=False).write.format("noop").mode("overwrite").save()
        self.warm_up_kafka(self.plan.output_topics(self.brokers()), self.plan.topic)

    def start(self, interval: str | None = None) -> StreamingQuery:
        """Start the query on the plan in force (resuming from its checkpoint); ``interval``: other than the lane's."""
        self.take_plan()
        rows = self._rows(self.source)
        writer = (rows.writeStream.format("kafka").options(**self.kafka_options).queryName(f"skyfilter_{LANE}_"
                                                                                           f"{self.plan.name}")
                  .option("checkpointLocation", str(self.plan.lane_checkpoint(LANE))).outputMode("update"))
        jvm = self.spark.sparkContext._jvm
        self.query = StreamingQuery(writer._jwrite.trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(
            interval or self.interval)).start())
        self.served = self.signature(self.plan)
        return self.query

    def pass_first_boundary(self, timeout_s: float = 120.0) -> None:
        """Before the night: run the query through one shortest batch and the boundary after it, then stop it.

        The first checkpoint boundary of a query in a fresh driver runs cold (the
        commit, the planning and the job submission not yet compiled by the JIT):
        2.6-4 s without reading, against 0.7-1.6 s at later ones.  With a checkpoint
        interval of minutes it would fall in the night, and the alerts that arrive
        during it would be the tail of the night's latency; passed here, every
        boundary of the night is a warm one.  Skipped when the interval is short
        (boundaries are then frequent, and the first one is no outlier).
        """
        if seconds(self.interval) < FIRST_BOUNDARY_AHEAD_FROM_S:
            return
        began = time.monotonic()
        query = self.start(interval=SHORTEST_INTERVAL)
        while time.monotonic() < began + timeout_s and query.isActive and query.lastProgress is None:
            time.sleep(0.1)
        passed = query.lastProgress is not None
        self.stop()
        self.log(f"realtime: {'passed' if passed else 'could not pass'} a first checkpoint boundary before the "
                 f"night, in a {SHORTEST_INTERVAL} batch ({time.monotonic() - began:.1f} s); checkpoint interval "
                 f"from now on: {self.interval}")

    def wait_until_reading(self, timeout_s: float = 120.0) -> bool:
        """Wait until the query's long-lived tasks run (False after ``timeout_s``).

        Starting the query returns before its first batch is planned and its tasks
        launched (seconds on a busy machine); the stream says it is running only
        after this, so alerts sent from then on are read as they come.
        """
        tracker = self.spark.sparkContext.statusTracker()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.query is not None and self.query.isActive:
            for job_id in tracker.getJobIdsForGroup(str(self.query.runId)):
                job = tracker.getJobInfo(job_id)
                stages = [tracker.getStageInfo(stage_id) for stage_id in (job.stageIds if job else [])]
                # Spark's status store shows a stage's task count late, so its first running task is the sign
                if any(stage is not None and stage.numActiveTasks > 0 for stage in stages):
                    return True
            time.sleep(0.1)
        return False

    def restart_if_changed(self) -> bool:
        """After a reload or a new input schema version: restart the query when what it serves changed."""
        if self.query is None or self.signature(self.cell.current) == self.served:
            return False
        self.log(f"realtime: restarting the Real-time Mode query for "
                 f"{', '.join(b.name for b in self.brokers(self.cell.current))} "
                 f"(filters, brokers or input schemas changed)")
        self.restart()
        return True

    def restart(self) -> StreamingQuery:
        """Start the query again from its checkpoint, warmed up (what it sent since then is sent again)."""
        self.take_plan()
        self.warm_up()
        self.stop()
        self.start()
        self.wait_until_reading()
        return self.query

    def recover_new_schema(self, failure: BaseException) -> StreamingQuery | None:
        """Restart a query that stopped on an input schema id it did not know, once the id is settled; else None.

        The query cannot read the registry between records, so an alert of a version
        registered after it started stops it (``skyfilter/stream/decode.py``).  The lane then reads
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
        self.log(f"realtime: alerts of input schema id {schema_id} arrived: restarting the Real-time Mode query")
        return self.restart()

    def progress(self, progress) -> None:
        """One finished Real-time batch (every checkpoint interval): its figures to the log, metrics and totals."""
        observed = (progress.observedMetrics or {}).get(OBSERVATION)
        if observed is None or not observed["input_alerts"]:
            return
        finished = time.time()
        started = finished - progress.batchDuration / 1000.0
        brokers = self.brokers()
        filters = lane_filters(self.plan, brokers)
        observed = observed.asDict()
        stats = batch_stats(observed, finished, filters, read_matches(observed, filters, brokers))
        stats["latency"], stats["latency_max"] = [None, None, None], None  # records leave as they come
        stats["matches"] = sum(stats["by_broker"].values())
        figures = self.monitor.batch_figures(LANE, progress.batchId, started, finished, stats["input_alerts"], [])
        self.summaries.write(summary_record(self.plan, LANE, self.monitor.run_id, progress.batchId,
                                            f"realtime {self.interval}", (started, None, finished), stats,
                                            figures, []))
        self.monitor.observe_delivery(LANE, progress.batchId, stats, figures, started, None, finished,
                                      [f.name for f in filters])
        self.totals.add_delivery(stats, started, finished)
        report_batch(self.log, LANE, progress.batchId, stats, self.plan.deadletter_topic, started, None)

    def stop(self) -> None:
        """Stop the query, without the stack traces Spark logs for each of its interrupted long-lived tasks."""
        if self.query is None or not self.query.isActive:
            return
        jvm = self.spark.sparkContext._jvm
        logger = jvm.org.apache.logging.log4j.LogManager.getRootLogger()
        level = logger.getLevel()
        jvm.org.apache.logging.log4j.core.config.Configurator.setRootLevel(jvm.org.apache.logging.log4j.Level.OFF)
        try:
            self.query.stop()
            time.sleep(0.5)  # the tasks log their interruption just after the query ends
        finally:
            jvm.org.apache.logging.log4j.core.config.Configurator.setRootLevel(level)

    def close(self) -> None:
        self.spark.streams.removeListener(self.listener)


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
                self.lane.log(f"realtime batch {event.progress.batchId}: {exc}")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
