"""The Delta tables of a stream, where they live, and idempotent appends to them.

Each input topic gets its own set of tables under ``<state_dir>/delta/<name>/``
(``name`` defaults to the topic): ``alerts`` (every accepted alert once,
partitioned by night, without its images), ``cutouts`` (the images, by night),
``schemas`` (writer schemas by id), ``matches`` (every alert-broker match, by night),
``metrics`` (one row per micro-batch) and ``rejects`` (messages that could not
be decoded, with their bytes and the reason), ``filter_status`` (quarantines)
and ``broker_visits`` (per broker and visit: matched, delivered, dropped by the cap).
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from skyfilter.config import Config

TABLES = ("alerts", "cutouts", "schemas", "matches", "metrics", "rejects", "filter_status", "broker_visits")

METRICS_SCHEMA = T.StructType([
    T.StructField("stream", T.StringType()),
    T.StructField("run_id", T.StringType()),
    T.StructField("batch_id", T.LongType()),
    T.StructField("trigger", T.StringType()),
    T.StructField("started_at", T.TimestampType()),
    T.StructField("delivered_at", T.TimestampType()),
    T.StructField("finished_at", T.TimestampType()),
    T.StructField("input_alerts", T.LongType()),
    T.StructField("rejected", T.LongType()),
    T.StructField("archived", T.LongType()),
    T.StructField("matches", T.LongType()),
    T.StructField("matches_by_broker", T.MapType(T.StringType(), T.LongType())),
    T.StructField("matches_by_filter", T.MapType(T.StringType(), T.LongType())),
    T.StructField("filter_errors", T.MapType(T.StringType(), T.StringType())),
    T.StructField("deliver_ms", T.DoubleType()),
    T.StructField("processing_ms", T.DoubleType()),
    T.StructField("latency_p50_ms", T.DoubleType()),
    T.StructField("latency_p95_ms", T.DoubleType()),
    T.StructField("latency_p99_ms", T.DoubleType()),
    T.StructField("latency_max_ms", T.DoubleType()),
    # the same figures the Prometheus endpoint shows (pipelines/monitoring.py)
    T.StructField("input_rows_per_second", T.DoubleType()),
    T.StructField("processed_rows_per_second", T.DoubleType()),
    T.StructField("kafka_lag", T.MapType(T.IntegerType(), T.LongType())),
    T.StructField("quarantined_filters", T.ArrayType(T.StringType())),
])


def table_paths(cfg: Config, name: str) -> dict[str, Path]:
    """Paths of a stream's Delta tables."""
    return {table: cfg.delta_dir / name / table for table in TABLES}


def append(frame: DataFrame, path: Path, app_id: str, batch_id: int, partition_by: str | None = None,
           merge_schema: bool = False) -> None:
    """Append to a Delta table exactly once per (app_id, batch_id), even when a batch is retried.

    ``merge_schema`` lets a table written by an older version gain the frame's new columns.
    """
    writer = (frame.write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", batch_id))
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.save(str(path))
