"""The night archive's layout: alert columns and images apart, and messages restored byte for byte.

``alerts`` holds every accepted alert's fields without its cutouts, plus
Kafka metadata and ``message_xxhash64``, a hash of the original message;
``cutouts`` holds the images keyed by the same message key; ``schemas``
holds the writer schema of every id seen, so the archive describes itself.

Avro's binary encoding of a value under a given schema is deterministic, so
re-encoding the archived fields with the writer schema gives back the
original message; every restored message is checked against its stored hash.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import to_avro

from pipelines.tables import is_table
from skyfilter.wire import frame

MESSAGE_KEY = ["night", "kafka_topic", "kafka_partition", "kafka_offset"]
HASH_COLUMN = "message_xxhash64"


def message_hash(value: Column) -> Column:
    """The hash stored for each original message (Spark's xxhash64)."""
    return F.xxhash64(value)


def with_message_hash(messages: DataFrame) -> DataFrame:
    """Add the hash of each row's ``kafka_value`` (the original message), as the archive stores it."""
    return messages.withColumn(HASH_COLUMN, message_hash(F.col("kafka_value")))


def split_archive(accepted: DataFrame, cutouts: list[str]) -> tuple[DataFrame, DataFrame]:
    """(alerts, cutouts) rows to archive for decoded, accepted alerts carrying :func:`with_message_hash`."""
    kept = [F.col(f"`{c}`") for c in accepted.columns if c not in {*cutouts, "kafka_value", HASH_COLUMN}]
    alerts = accepted.select(*kept, HASH_COLUMN)
    images = accepted.select(*MESSAGE_KEY, "alert_id", *cutouts)
    return alerts, images


def restore_messages(alerts: DataFrame, images: DataFrame, schema_json: str, schema_id: int,
                     fields: list[str]) -> DataFrame:
    """Archived alerts with their cutouts rejoined and ``kafka_value`` re-encoded in the wire format.

    Adds ``byte_identical``: whether the restored message hashes like the original.
    """
    joined = alerts.join(images.drop("alert_id"), MESSAGE_KEY, "left")
    value = F.concat(F.lit(bytearray(frame(schema_id, b""))), to_avro(F.struct(*fields), schema_json))
    restored = joined.withColumn("kafka_value", value)
    return restored.withColumn("byte_identical", message_hash(F.col("kafka_value")) == F.col(HASH_COLUMN))


def record_schema(spark: SparkSession, path: Path, schema_id: int, schema_json: str) -> None:
    """Keep a writer schema in the archive's ``schemas`` table (once per id)."""
    if is_table(spark, path):
        known = spark.read.format("delta").load(str(path)).where(F.col("schema_id") == schema_id).count()
        if known:
            return
    row = spark.createDataFrame([(schema_id, schema_json)], "schema_id long, schema_json string")
    row.write.format("delta").mode("append").save(str(path))


def archived_schema(spark: SparkSession, path: Path, schema_id: int | None = None) -> tuple[int, str]:
    """The (id, JSON) of an archived writer schema (the only one, or the one with ``schema_id``)."""
    rows = spark.read.format("delta").load(str(path)).collect()
    if schema_id is not None:
        rows = [r for r in rows if r.schema_id == schema_id]
    if len(rows) != 1:
        from skyfilter.errors import SkyfilterError

        raise SkyfilterError(f"{path}: expected one archived schema, found {len(rows)}")
    return rows[0].schema_id, rows[0].schema_json
