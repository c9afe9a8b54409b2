"""The night archive's layout: every alert's original message and the columns it is found by.

``alerts`` holds, per accepted alert, ``kafka_value``: the original message,
byte for byte, with its Kafka metadata, its night (the partition), visit,
alert id and writer schema id: the *raw* layout.  The archive lane decodes
only the few fields those come from (Avro skips the rest), and the alert's
fields are decoded when a night is read (:func:`with_fields`): replay and
re-filtering decode anyway, and writing thousands of nested columns was most
of the archive's cost (docs/performance.md).  Replay re-emits the exact bytes,
whatever the writer schema was, and the images come from the same bytes on
read (:func:`with_cutouts`).  ``schemas`` holds the writer schema of every id
seen, so the archive describes itself.

Archives of the layout before (the decoded fields beside the message) are read
as they are and a stream keeps appending to them in that layout; archives of
the earliest one (a ``cutouts`` table and a message hash instead of
``kafka_value``) are still read: their messages are restored by re-encoding
the fields with the writer schema and checked against the hash.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from skyfilter.core.alert_columns import AlertColumns
from skyfilter.core.errors import SkyfilterError
from skyfilter.filtering.input_schemas import per_writer
from skyfilter.plan.tables import RAW_COLUMNS, is_table
from skyfilter.schemas.avro import cutout_fields, only_paths, schema_text
from skyfilter.schemas.wire import HEADER_SIZE, frame
from skyfilter.spark.internals import unresolved_column_names

MESSAGE_KEY = ["night", "kafka_topic", "kafka_partition", "kafka_offset"]
STATS_COLUMNS = ["visit_id", "alert_id", "schema_id", "kafka_timestamp", "kafka_partition", "kafka_offset"]
LEGACY_HASH_COLUMN = "message_xxhash64"


def archive_rows(accepted: DataFrame, raw: bool = False) -> DataFrame:
    """The ``alerts`` rows of decoded, accepted alerts: every column but the decode's reject reason, or (``raw``)
    the message and the columns the archive is partitioned and looked up by."""
    return accepted.select(*RAW_COLUMNS) if raw else accepted.drop("reject_reason")


def index_paths(spark: SparkSession, columns: AlertColumns) -> list[str]:
    """The alert fields the raw layout decodes: those its alert id, observation time and visit are made of."""
    return list(dict.fromkeys(path for expression in (columns.alert_id, columns.time_mjd, columns.visit_id)
                              for path in unresolved_column_names(spark, expression)))


def index_reader(reader: dict, paths: list[str]) -> str:
    """The reader schema of the raw layout's decode: ``reader`` pruned to ``paths`` (Avro skips the rest)."""
    return schema_text(only_paths(reader, paths))


def is_raw(alerts: DataFrame) -> bool:
    """Whether an ``alerts`` table is of the raw layout (the message and its index columns, no alert field)."""
    return set(alerts.columns) <= set(RAW_COLUMNS)


def with_fields(alerts: DataFrame, writers: dict[int, str], reader: dict) -> DataFrame:
    """Raw-layout alerts with the alert's fields beside them, as the stream's filters see them (``reader``: the
    fields to decode, cutouts left out), decoded from each row's message with the writer schema of its id."""
    options = {"mode": "PERMISSIVE", "avroSchema": schema_text(reader)}
    body = F.expr(f"substring(kafka_value, {HEADER_SIZE + 1})")
    decoded = per_writer(F.col("schema_id"), {i: from_avro(body, text, options) for i, text in writers.items()})
    names = [field["name"] for field in reader["fields"]]
    return alerts.withColumn("_alert", decoded).select(*alerts.columns, *[F.col(f"_alert.`{n}`").alias(n)
                                                                           for n in names])


def with_cutouts(alerts: DataFrame, schema: dict, cutouts: list[str] | None = None) -> DataFrame:
    """Archived alerts with their cutout columns (by default the schema's detected ones), decoded from each
    row's original message.

    Avro resolution onto a reader schema of the cutout fields alone skips every other field.
    """
    cutouts = cutout_fields(schema) if cutouts is None else cutouts
    reader = {**schema, "fields": [f for f in schema["fields"] if f["name"] in cutouts]}
    images = from_avro(F.expr(f"substring(kafka_value, {HEADER_SIZE + 1})"), schema_text(schema),
                       {"avroSchema": schema_text(reader), "mode": "PERMISSIVE"})
    return alerts.withColumn("_images", images).select("*", *[F.col(f"_images.`{c}`").alias(c) for c in cutouts]) \
        .drop("_images")


def is_legacy(alerts: DataFrame) -> bool:
    """Whether an ``alerts`` table is of the earlier layout (images in a ``cutouts`` table, no message column)."""
    return "kafka_value" not in alerts.columns and LEGACY_HASH_COLUMN in alerts.columns


def restore_legacy_messages(alerts: DataFrame, images: DataFrame, schema_json: str, schema_id: int) -> DataFrame:
    """Alerts of the earlier layout with ``kafka_value`` rebuilt: cutouts rejoined, fields re-encoded with the
    writer schema (Avro's binary encoding is deterministic), ``byte_identical`` checked against the stored hash."""
    fields = [f["name"] for f in json.loads(schema_json)["fields"]]
    joined = alerts.join(images.drop("alert_id"), MESSAGE_KEY, "left")
    value = F.concat(F.lit(bytearray(frame(schema_id, b""))), to_avro(F.struct(*fields), schema_json))
    restored = joined.withColumn("kafka_value", value)
    return restored.withColumn("byte_identical", _hash(F.col("kafka_value")) == F.col(LEGACY_HASH_COLUMN)) \
        .drop(LEGACY_HASH_COLUMN)


def _hash(value: Column) -> Column:
    return F.xxhash64(value)


def record_schema(spark: SparkSession, path: Path, schema_id: int, schema_json: str) -> None:
    """Keep a writer schema in the archive's ``schemas`` table (once per id)."""
    if is_table(spark, path):
        known = spark.read.format("delta").load(str(path)).where(F.col("schema_id") == schema_id).count()
        if known:
            return
    row = spark.createDataFrame([(schema_id, schema_json)], "schema_id long, schema_json string")
    row.write.format("delta").mode("append").save(str(path))


def archived_schemas(spark: SparkSession, path: Path, ids: list[int]) -> dict[int, str]:
    """The JSON of archived writer schemas by id, in the order of ``ids`` (all of them when ``ids`` is empty)."""
    rows = {r.schema_id: r.schema_json for r in spark.read.format("delta").load(str(path)).collect()}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise SkyfilterError(f"{path}: no archived schema with id {', '.join(map(str, missing))}")
    return {i: rows[i] for i in ids} if ids else rows


def archived_schema(spark: SparkSession, path: Path, schema_id: int | None = None) -> tuple[int, str]:
    """The (id, JSON) of an archived writer schema (the only one, or the one with ``schema_id``)."""
    found = archived_schemas(spark, path, [] if schema_id is None else [schema_id])
    if len(found) != 1:
        raise SkyfilterError(f"{path}: expected one archived schema, found {len(found)}")
    return next(iter(found.items()))
