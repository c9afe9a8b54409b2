"""Kafka rows to alerts: check the wire-format header, decode once with from_avro, add night/visit/id.

Each message is decoded with its own writer schema (the id in its header),
resolved onto the stream's one reader schema (``skyfilter/filtering/input_schemas.py``).
Messages that cannot be decoded are not dropped: they keep their bytes and
get a ``reject_reason`` (null for good alerts).

The delivery lane decodes with a *reader schema* that leaves the cutouts out
(Avro schema resolution skips their bytes: filters never read images); the
archive lane decodes everything.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from skyfilter.core.alert_columns import MJD_UNIX_EPOCH, AlertColumns
from skyfilter.filtering.input_schemas import NEW_SCHEMA_ERROR, InputSchemas, per_writer
from skyfilter.schemas.avro import schema_text
from skyfilter.spark.steps import Step, apply_steps, select

# Columns the stream adds around the alert's own fields.
KAFKA_COLUMNS = ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value"]
DERIVED_COLUMNS = ["night", "visit_id", "alert_id", "schema_id", "reject_reason"]


def alert_field_names(reader_json: str) -> list[str]:
    """The decoded alert's own top-level columns (the reader schema's fields), beside the Kafka and derived ones."""
    return [field["name"] for field in json.loads(reader_json)["fields"]]


def is_accepted() -> Column:
    """True for rows that decoded into an alert (``reject_reason`` is null)."""
    return F.col("reject_reason").isNull()


def reserved_columns() -> list[str]:
    """Names an alert schema's top-level fields must not use."""
    return KAFKA_COLUMNS + DERIVED_COLUMNS


def night_of(time_mjd: Column, offset_hours: float) -> Column:
    """The night label (YYYY-MM-DD): UTC date of the observation time minus the offset."""
    millis = ((time_mjd - F.lit(MJD_UNIX_EPOCH) - F.lit(offset_hours / 24.0)) * 86_400_000).cast("long")
    return F.date_format(F.timestamp_millis(millis), "yyyy-MM-dd")


def decode(raw: DataFrame, schemas: InputSchemas, columns: AlertColumns, night_offset_hours: float,
           max_bytes: int | None = None, reader_json: str | None = None, unknown_fails: bool = False) -> DataFrame:
    """One row per Kafka message: Kafka metadata, derived columns, then the alert's fields.

    Each message is decoded with the writer schema its header names, resolved
    onto ``reader_json`` (by default the reader schema of ``schemas``; fields it
    leaves out are skipped).  A message whose id the stream has not settled is a
    dead letter, or with ``unknown_fails`` stops the query with
    :data:`NEW_SCHEMA_ERROR` (for a query that cannot look the id up itself).
    """
    return apply_steps(raw, decode_steps(schemas, columns, night_offset_hours, max_bytes, reader_json,
                                         unknown_fails))


def decode_steps(schemas: InputSchemas, columns: AlertColumns, night_offset_hours: float,
                 max_bytes: int | None = None, reader_json: str | None = None,
                 unknown_fails: bool = False) -> list[Step]:
    """The steps of :func:`decode`, to build once and apply to many batches of Kafka rows."""
    reader_json = reader_json or schema_text(schemas.reader)
    options = {"mode": "PERMISSIVE", "avroSchema": reader_json}
    value = F.col("value")
    header_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    framed_ok = value.isNotNull() & (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(bytearray(b"\x00")))
    if max_bytes:
        framed_ok = framed_ok & (F.length(value) <= max_bytes)
    body = F.expr("substring(value, 6)")
    alert = per_writer(F.when(framed_ok, header_id),
                       {schema_id: from_avro(body, writer, options) for schema_id, writer in schemas.readable.items()})
    with_alert = select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("kafka_key"), F.col("value").alias("kafka_value"),
        F.when(framed_ok, header_id).alias("schema_id"), alert.alias("_alert"),
    )
    settled = F.col("schema_id").isin(*schemas.known) if schemas.known else F.lit(False)
    unknown = (F.raise_error(F.format_string(f"{NEW_SCHEMA_ERROR} %d", "schema_id")) if unknown_fails else
               F.format_string(f"schema id %d is not registered for topic '{schemas.topic}'", "schema_id"))
    reason = (F.when(F.col("kafka_value").isNull(), F.lit("null value"))
              .when(F.length("kafka_value") == 0, F.lit("zero-length value"))
              .when(F.length("kafka_value") < 5, F.lit("shorter than the 5-byte wire-format header"))
              .when(F.length("kafka_value") > F.lit(max_bytes or 2**31 - 1),
                    F.format_string(f"oversized: %d bytes, over stream.max_alert_bytes ({max_bytes})",
                                    F.length("kafka_value")))
              .when(F.substring("kafka_value", 1, 1) != F.lit(bytearray(b"\x00")),
                    F.lit("wrong magic byte (not Confluent wire format)"))
              .when(~settled, unknown))
    for schema_id, why in schemas.reasons.items():
        reason = reason.when(F.col("schema_id") == schema_id, F.lit(why))
    reason = reason.when(F.col("_alert").isNull(), F.lit("Avro body does not decode with its writer schema"))
    flat = select(*KAFKA_COLUMNS, "schema_id", reason.alias("reject_reason"), "_alert.*")
    alert_fields = alert_field_names(reader_json)
    # PERMISSIVE from_avro gives a record of nulls for a body it cannot read: no alert id means no alert.
    reject = F.coalesce(F.col("reject_reason"), F.when(F.expr(columns.alert_id).isNull(), F.lit(
        "Avro body does not decode with its writer schema (no alert id)")))
    derived = select(
        night_of(F.expr(columns.time_mjd), night_offset_hours).alias("night"),
        F.expr(columns.visit_id).cast("long").alias("visit_id"),
        F.expr(columns.alert_id).cast("string").alias("alert_id"),
        *[reject.alias(c) if c == "reject_reason" else F.col(f"`{c}`")
          for c in [*KAFKA_COLUMNS, "schema_id", "reject_reason", *alert_fields]],
    )
    return [with_alert, flat, derived]
