"""Where a Real-time query's tasks have read to: marks on its input rows, and the lane's lag and reads from them.

A Real-time query reports its offsets at its checkpoints only (minutes apart);
its lag read from the checkpoint would be a sawtooth of that period, and its
alerts-read counter would jump once per period.  Each input row passes through
skyfilter's read-mark function (``skyfilter/spark/jvm/ReadMarks.java``) instead,
which notes per partition the next offset and the rows read; the tasks of a
local master run in the driver's JVM, where the monitor reads the marks.  On a
cluster master the executors send their marks to the driver's JVM as they move
(five times a second), so the lane is measured the same way there.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.core.lane_names import LaneName
from skyfilter.kafka.lag import LatestOffsets
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.read_positions import marked_positions, past_checkpoint, read_to, start_positions
from skyfilter.plan.stream_plan import StreamPlan
from skyfilter.spark.internals import READ_MARK_FUNCTION, read_marks, register_jvm_function, serve_read_marks


def reader_name(spark: SparkSession, stream: str, local_master: bool) -> str:
    """The name a stream's Real-time tasks mark their reads under; on a cluster master, with the address the
    executors send their marks to (the driver listens from now on, at ``spark.driver.host``)."""
    name = f"{stream}:{LaneName.REALTIME}"
    return name if local_master else name + serve_read_marks(spark, spark.conf.get("spark.driver.host"))


def rehearsal_reader(reader: str) -> str:
    """The name the rehearsal of a stream's night marks its reads under: apart from the night's reader, with the
    same address on a cluster."""
    name, at, address = reader.partition("@")
    return f"{name}.rehearsal{at}{address}"


def marked_reads(spark: SparkSession, reader: str, source: DataFrame) -> DataFrame:
    """The Kafka source ``source`` of a stream's Real-time lane, each row marking where its task read to."""
    register_jvm_function(spark, "ReadMarks")
    return source.where(F.call_function(READ_MARK_FUNCTION, F.lit(reader), "topic", "partition",
                                        "offset", F.unix_millis("timestamp")))


class RealtimeReads:
    """Where a stream's Real-time tasks have read to: their marks, else where the lane started or its checkpoint."""

    def __init__(self, spark: SparkSession, reader: str, checkpoint: Path, topic: str, started: dict[int, int]):
        self.checkpoint, self.topic, self.started = checkpoint, topic, started
        self.marks = lambda: read_marks(spark, reader)
        self.positions = marked_positions(self.marks, topic, started, checkpoint)

    def rows_read(self) -> int:
        """Rows the tasks of this JVM's queries read under the reader's name (every run of the lane)."""
        return sum(mark[2] for mark in self.marks().values())

    def past_checkpoint(self) -> int:
        """Alerts read since the lane's last checkpoint: delivered, and not yet in its checkpoints' figures."""
        return past_checkpoint(self.positions([]), self.checkpoint, self.topic, self.started)

    def reached(self, ends: dict[int, int]) -> bool:
        """Whether the tasks have read up to ``ends`` (partition -> offset) in every partition."""
        return read_to(self.positions([]), ends)


def watch_realtime_reads(spark: SparkSession, cfg: Config, monitor: StreamMonitor, plan: StreamPlan,
                         interval: str, reader: str) -> RealtimeReads:
    """Measure the Real-time lane from the read marks of ``reader``: its lag (where none was made yet, from where
    it started) and its alerts read, as they are read."""
    checkpoint, topic = plan.lane_checkpoint(LaneName.REALTIME), plan.topic
    latest = LatestOffsets(cfg)
    try:
        started = start_positions(checkpoint, topic, latest(topic), str(cfg.stream.starting_offsets))
    finally:
        latest.close()
    reads = RealtimeReads(spark, reader, checkpoint, topic, started)
    monitor.add_lane(LaneName.REALTIME, checkpoint, f"realtime {interval}", committed=reads.positions,
                     rows_read=reads.rows_read)
    return reads
