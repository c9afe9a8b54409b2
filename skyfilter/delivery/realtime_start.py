"""A Real-time query made ready before the night: its code run on probe alerts, the night's query rehearsed
on a private topic through its first checkpoint boundary, and the wait until its long-lived tasks read.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from confluent_kafka import KafkaException
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LaneName
from skyfilter.delivery.realtime_reads import marked_reads, rehearsal_reader
from skyfilter.delivery.rehearsal_topic import fill_rehearsal
from skyfilter.kafka.topics import ensure_topics
from skyfilter.plan.stream_plan import StreamPlan, probe_batch, probe_values
from skyfilter.spark.internals import (
    announce_query_stop,
    close_visit_caps,
    compiled_classes,
    open_visit_caps,
    read_marks,
)

logger = logging.getLogger(__name__)

SHORTEST_INTERVAL = "5 seconds"  # Spark's spark.sql.streaming.realTimeMode.minBatchDuration
WARM_UP_LEDGER = ".warm-up"
SCRATCH_RETENTION_MS = 60_000  # what the rehearsal writes is read by nobody


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
    seconds per thousand; 0: the Kafka clients alone).  The
    probe's caps go to a ledger of their own, forgotten afterwards.
    """
    began = time.monotonic()
    alerts = lane.cfg.stream.realtime.warm_up_alerts if alerts is None else alerts
    if not lane.local_master:  # each executor JVM compiles for itself: every task slot gets a driver's share
        alerts *= max(1, int(lane.spark.sparkContext.defaultParallelism))
    if alerts:
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


def rehearse(lane: RealtimeLane, reader: str, source_of: Callable[[str, str], DataFrame],
             timeout_s: float = 120.0) -> None:
    """Before the night: run the night's own query on the rehearsal topic, through a shortest batch and the
    checkpoint boundary after it.

    A query started cold in a fresh driver spends its first visits compiling: Spark
    generates its classes, the JIT compiles what runs often, and its first checkpoint
    boundary (commit, planning, job submission) runs cold too, 2.6-4 s.  The rehearsal
    is the very query of the night (the same filters, encodings and Kafka sink, the
    same Real-time trigger) on :data:`stream.realtime.rehearsal_alerts` alerts like the
    night's (``skyfilter/delivery/rehearsal_topic.py``), so the night's query finds its
    classes in Spark's code cache and its paths compiled, and every boundary of the
    night is a warm one.  ``source_of(topic, starting_offsets)``: the night's Kafka
    source, on another topic; its reads are marked apart from the night's ``reader``.

    Nothing of it reaches a broker, the archive or the night's caps: it writes every
    row to a scratch topic (:func:`boundary_pass_topic`; Real-time Mode takes no sink
    but Kafka's and foreach), with a checkpoint of its own and the warm-up's filter
    sets and cap ledger, and the night's query starts where the stream starts.  A
    rehearsal that fails says so in one line and the night starts cold.
    """
    began, plan = time.monotonic(), lane.plan
    checkpoint = lane.cfg.run_dir / f"filter_stream.{plan.name}.rehearsal"
    shutil.rmtree(checkpoint, ignore_errors=True)
    try:
        rehearsal = fill_rehearsal(lane.cfg, plan.topic, plan.name, lane.cfg.stream.realtime.rehearsal_alerts,
                                   probe_messages(plan))
        scratch = boundary_pass_topic(plan)
        ensure_topics(lane.cfg, {scratch: 1}, {"retention.ms": str(SCRATCH_RETENTION_MS)})
        compiled = compiled_classes(lane.spark)
        with warm_up_ledger(lane) as ledger:
            marks = rehearsal_reader(reader)
            source = marked_reads(lane.spark, marks, source_of(rehearsal.topic, rehearsal.starting_offsets))
            query = (lane.rows(source, ledger, observed=False, warm_up=True)
                     .writeStream.format("kafka").options(**lane.kafka_options)
                     .option("topic", scratch)  # every row there, whatever its topic
                     .queryName(f"skyfilter_{LaneName.REALTIME}_{plan.name}_rehearsal")
                     .option("checkpointLocation", str(checkpoint)).outputMode("update")
                     .trigger(realTime=SHORTEST_INTERVAL).start())
            try:
                read = _await_rehearsal(query, lambda: _rows_read(lane.spark, marks, rehearsal.topic),
                                        rehearsal.alerts, began + timeout_s)
            finally:
                announce_query_stop(lane.spark, str(query.runId))
                query.stop()
        if query.exception() is not None:
            raise SkyfilterError(str(query.exception()).splitlines()[0])
    except (KafkaException, SkyfilterError, Py4JError, OSError) as exc:
        logger.warning(f"realtime: no rehearsal before the night ({str(exc).splitlines()[0]}): the night's "
                       f"query starts cold")
        return
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    logger.info(f"realtime: rehearsed the night's query on {read} of {rehearsal.alerts} alert(s) "
                f"({rehearsal.copied} copied from the topic, {rehearsal.probes} probes) and a checkpoint boundary "
                f"in {time.monotonic() - began:.1f} s ({compiled_classes(lane.spark) - compiled} classes "
                f"generated); checkpoint interval from now on: {lane.interval}")


def _await_rehearsal(query: StreamingQuery, rows_read: Callable[[], int], alerts: int, deadline: float) -> int:
    """Wait until the rehearsal has read its ``alerts`` and passed a checkpoint boundary (or the deadline);
    the alerts it read."""
    while time.monotonic() < deadline and query.isActive:
        if query.lastProgress is not None and rows_read() >= alerts:
            break
        time.sleep(0.1)
    return rows_read()


def _rows_read(spark: SparkSession, reader: str, topic: str) -> int:
    return sum(rows for (marked, _), (_, _, rows) in read_marks(spark, reader).items() if marked == topic)


def probe_messages(plan: StreamPlan) -> list[bytes]:
    """Probe messages of the topic's writer schemas, every field filled in, and one empty message (the path of
    what cannot be decoded)."""
    return [b"", *probe_values(plan)]


def boundary_pass_topic(plan: StreamPlan) -> str:
    """The scratch topic a stream's rehearsal writes to (under the input topic's prefix, which the stream's
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
