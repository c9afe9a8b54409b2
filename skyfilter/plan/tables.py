"""The Delta tables of a stream, where they live, and idempotent appends to them.

Each input topic gets its own set of tables under ``<state_dir>/delta/<name>/``
(``name`` defaults to the topic): ``alerts`` (every accepted alert once,
partitioned by night: its fields and its original message, see
``skyfilter/archive/layout.py``), ``cutouts`` (images, only in archives of the earlier
layout), ``schemas`` (writer schemas by id), ``matches`` (every alert-broker match
delivered, by night), ``metrics`` (one row per batch of each lane) and
``rejects`` (messages that could not be decoded, with their bytes and the
reason), ``filter_status`` (quarantines) and ``broker_visits`` (per broker,
visit and delivery batch: matched, delivered, dropped by the cap).

All of them but ``filter_status`` are written by the archive lane, exactly
once: its own input with idempotent appends per batch (:func:`append`), what
it reads from the delivery log by inserting only rows not yet there
(``skyfilter/archive/insert_once.py``), since a delivery batch that is retried logs again.
"""

from __future__ import annotations

from pathlib import Path

from pyspark import InheritableThread
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from skyfilter.core.config import Config
from skyfilter.filtering.decode import KAFKA_COLUMNS

RAW_COLUMNS = [*KAFKA_COLUMNS, "night", "visit_id", "alert_id", "schema_id"]  # the raw layout of ``alerts``
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
    # the same figures the Prometheus endpoint shows (skyfilter/lanes/monitoring.py)
    T.StructField("input_rows_per_second", T.DoubleType()),
    T.StructField("processed_rows_per_second", T.DoubleType()),
    T.StructField("kafka_lag", T.MapType(T.IntegerType(), T.LongType())),
    T.StructField("quarantined_filters", T.ArrayType(T.StringType())),
    # which lane ran the batch (delivery, realtime, archive) and the id of its query (stable across restarts)
    T.StructField("lane", T.StringType()),
    T.StructField("query_id", T.StringType()),
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


def create_table(spark, path: Path, schema, partition_by: str | None = None, stats_columns: list[str] | None = None
                 ) -> None:
    """Create an empty Delta table with this schema at ``path`` unless one is there: one commit, no Spark job.

    ``stats_columns``: the columns Delta keeps min/max statistics of for data skipping (by default its first 32);
    the message bytes of the archive are worth none.
    """
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(str(path)).addColumns(nullable(schema))
    if stats_columns:
        builder = builder.property("delta.dataSkippingStatsColumns", ",".join(stats_columns))
    (builder.partitionedBy(partition_by) if partition_by else builder).execute()


def nullable(data_type: T.DataType) -> T.DataType:
    """``data_type`` with every field and element nullable, as Delta stores a DataFrame's schema on write."""
    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(nullable(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(nullable(data_type.keyType), nullable(data_type.valueType), True)
    return data_type


def raw_layout(path: Path) -> bool | None:
    """Whether the ``alerts`` table at ``path`` is of the raw layout (the message and its index columns); None
    when there is no table yet.  Read from its Delta log alone, without Spark."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return None
    columns = set(DeltaTable(str(path)).schema().to_arrow().names)
    return "kafka_value" in columns and columns <= set(RAW_COLUMNS)


def is_table(spark, path: Path) -> bool:
    """Whether a Delta table with at least one commit is at ``path`` (a crash can leave an empty ``_delta_log``)."""
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, str(path))


def run_side_by_side(tasks: list) -> None:
    """Run Spark actions in parallel threads (inheriting the batch's Spark properties); re-raise the first error."""
    errors: list[BaseException] = []

    def guarded(task) -> None:
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the batch's thread below
            errors.append(exc)

    threads = [InheritableThread(target=guarded, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
