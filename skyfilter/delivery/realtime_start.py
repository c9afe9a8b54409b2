"""A Real-time query made ready before the night: its code run on probe alerts, its first checkpoint boundary
passed on a query of its own, and the wait until its long-lived tasks read.

A query started cold in a fresh driver spends its first visits compiling (the
JIT) and its first checkpoint boundary planning; both would be the night's
latency.  What is done here is done before the stream says ``running:``, and
leaves nothing behind: no delivery, no cap admission, no checkpoint of the
night's query.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.lane_names import LaneName
from skyfilter.kafka.topics import ensure_topics
from skyfilter.plan.stream_plan import StreamPlan, probe_batch
from skyfilter.plan.triggers import seconds
from skyfilter.spark.internals import announce_query_stop, close_visit_caps, open_visit_caps

logger = logging.getLogger(__name__)

SHORTEST_INTERVAL = "5 seconds"  # Spark's spark.sql.streaming.realTimeMode.minBatchDuration
FIRST_BOUNDARY_AHEAD_FROM_S = 30.0  # checkpoint intervals from which the first boundary is passed at start-up
WARM_UP_LEDGER = ".warm-up"
SCRATCH_RETENTION_MS = 60_000  # what the boundary pass writes is read by nobody


class RealtimeLane(Protocol):
    """What getting ready uses of the Real-time lane (``skyfilter/delivery/realtime.py``)."""

    cfg: Config
    spark: SparkSession
    plan: StreamPlan
    interval: str
    local_master: bool
    query: StreamingQuery | None
    kafka_options: dict[str, str]

    def brokers(self) -> list[BrokerSpec]: ...

    def rows(self, source: DataFrame, ledger: str, observed: bool = True, warm_up: bool = False) -> DataFrame: ...

    def ledger_address(self, ledger: str) -> str: ...

    def ledger_file(self, suffix: str = "") -> Path: ...

    def warm_up_kafka(self, topics: list[str], input_topic: str) -> None: ...


def warm_up(lane: RealtimeLane, alerts: int | None = None) -> None:
    """Run the query's code on probe alerts, and open the Kafka clients, before the long-lived tasks start.

    Spark caches generated code by its text and the JVM compiles what ran often, so
    the Real-time tasks find the decoding and filtering compiled, and the Kafka
    producer holding the output topics' metadata, instead of the first visit waiting
    for them.  ``alerts``: how many probe alerts (default ``stream.realtime.warm_up_alerts``,
    times the task slots on a cluster; more let the JIT compile more before the night, at
    seconds per thousand).  The
    probe's caps go to a ledger of their own, forgotten afterwards.
    """
    began, alerts = time.monotonic(), alerts or lane.cfg.stream.realtime.warm_up_alerts
    if not lane.local_master:  # each executor JVM compiles for itself: every task slot gets a driver's share
        alerts *= max(1, int(lane.spark.sparkContext.defaultParallelism))
    probe = probe_batch(lane.spark, lane.plan, alerts)
    with warm_up_ledger(lane) as ledger:
        lane.rows(probe, ledger, observed=False, warm_up=True).write.format("noop").mode("overwrite").save()
    lane.warm_up_kafka(lane.plan.output_topics(lane.brokers()), lane.plan.topic)
    logger.info(f"realtime: warmed up on {alerts} probe alerts in {time.monotonic() - began:.1f} s")


@contextlib.contextmanager
def warm_up_ledger(lane: RealtimeLane) -> Iterator[str]:
    """The address of a visit cap ledger of its own for a warm-up's query, forgotten afterwards: what the
    warm-up admits never counts against the night's caps."""
    ledger = f"{lane.plan.name}{WARM_UP_LEDGER}"
    capped = any(b.max_alerts_per_visit is not None for b in lane.brokers())
    if capped:
        open_visit_caps(lane.spark, ledger, str(lane.ledger_file(WARM_UP_LEDGER)), 0)
    try:
        yield lane.ledger_address(ledger)
    finally:
        if capped:
            close_visit_caps(lane.spark, ledger)


def pass_first_boundary(lane: RealtimeLane, source: DataFrame, timeout_s: float = 120.0) -> None:
    """Before the night: run the query's code through one shortest batch and the boundary after it.

    The first checkpoint boundary of a query in a fresh driver runs cold (the
    commit, the planning and the job submission not yet compiled by the JIT):
    2.6-4 s without reading, against 0.7-1.6 s at later ones.  With a checkpoint
    interval of minutes it would fall in the night, and the alerts that arrive
    during it would be the tail of the night's latency; passed here, every
    boundary of the night is a warm one.  Skipped when the interval is short
    (boundaries are then frequent, and the first one is no outlier).

    The pass is a query of its own: ``source`` (the input topic from its end) through
    the night's code into a scratch topic (:func:`boundary_pass_topic`; Real-time Mode
    takes no sink but Kafka's and foreach), with a checkpoint of its own, the warm-up's
    filter sets and cap ledger.  Nothing it reads is delivered, capped or checkpointed
    for the night, so the night's query starts where the stream starts.  (Run as the
    night's own query, what its second batch delivered before the stop was delivered
    again.)
    """
    if seconds(lane.interval) < FIRST_BOUNDARY_AHEAD_FROM_S:
        return
    began = time.monotonic()
    checkpoint = lane.cfg.run_dir / f"filter_stream.{lane.plan.name}.boundary-pass"
    shutil.rmtree(checkpoint, ignore_errors=True)
    scratch = boundary_pass_topic(lane.plan)
    ensure_topics(lane.cfg, {scratch: 1}, {"retention.ms": str(SCRATCH_RETENTION_MS)})
    with warm_up_ledger(lane) as ledger:
        query = (lane.rows(source, ledger, observed=False, warm_up=True).writeStream.format("kafka")
                 .options(**lane.kafka_options).option("topic", scratch)  # every row there, whatever its topic
                 .queryName(f"skyfilter_{LaneName.REALTIME}_{lane.plan.name}_boundary_pass")
                 .option("checkpointLocation", str(checkpoint)).outputMode("update")
                 .trigger(realTime=SHORTEST_INTERVAL).start())
        try:
            while time.monotonic() < began + timeout_s and query.isActive and query.lastProgress is None:
                time.sleep(0.1)
            passed = query.lastProgress is not None
        finally:
            announce_query_stop(lane.spark, str(query.runId))
            query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    logger.info(f"realtime: {'passed' if passed else 'could not pass'} a first checkpoint boundary before the "
                f"night, in a {SHORTEST_INTERVAL} batch ({time.monotonic() - began:.1f} s); checkpoint interval "
                f"from now on: {lane.interval}")


def boundary_pass_topic(plan: StreamPlan) -> str:
    """The scratch topic a stream's boundary pass writes to (under the input topic's prefix, which the stream's
    principal may write on a secure cluster)."""
    return f"{plan.topic}.boundary-pass" + ("" if plan.name == plan.topic else f".{plan.name}")


def wait_until_reading(lane: RealtimeLane, timeout_s: float = 120.0) -> bool:
    """Wait until the query's long-lived tasks run (False after ``timeout_s``).

    Starting the query returns before its first batch is planned and its tasks
    launched (seconds on a busy machine); the stream says it is running only
    after this, so alerts sent from then on are read as they come.
    """
    tracker = lane.spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and lane.query is not None and lane.query.isActive:
        for job_id in tracker.getJobIdsForGroup(str(lane.query.runId)):
            job = tracker.getJobInfo(job_id)
            stages = [tracker.getStageInfo(stage_id) for stage_id in (job.stageIds if job else [])]
            # Spark's status store shows a stage's task count late, so its first running task is the sign
            if any(stage is not None and stage.numActiveTasks > 0 for stage in stages):
                return True
        time.sleep(0.1)
    return False
