"""Kafka rows to alerts: check the wire-format header, decode once with from_avro, add night/visit/id.

Messages that cannot be decoded with the topic's schema are not dropped:
they keep their bytes and get a ``reject_reason`` (null for good alerts).

The delivery lane decodes with a *reader schema* that leaves the cutouts out
(Avro schema resolution skips their bytes: filters never read images); the
archive lane decodes everything.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from pipelines.steps import Step, apply_steps, select
from skyfilter.alert_columns import MJD_UNIX_EPOCH, AlertColumns

# Columns the stream adds around the alert's own fields.
KAFKA_COLUMNS = ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value"]
DERIVED_COLUMNS = ["night", "visit_id", "alert_id", "schema_id", "reject_reason"]


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


def decode(raw: DataFrame, schema_json: str, schema_id: int, columns: AlertColumns,
           night_offset_hours: float, max_bytes: int | None = None, reader_json: str | None = None) -> DataFrame:
    """One row per Kafka message: Kafka metadata, derived columns, then the alert's fields.

    ``schema_json`` is the writer schema of the topic; with ``reader_json`` the
    alert is resolved onto that schema instead (fields it leaves out are skipped).
    """
    return apply_steps(raw, decode_steps(schema_json, schema_id, columns, night_offset_hours, max_bytes,
                                         reader_json))


def decode_steps(schema_json: str, schema_id: int, columns: AlertColumns, night_offset_hours: float,
                 max_bytes: int | None = None, reader_json: str | None = None) -> list[Step]:
    """The steps of :func:`decode`, to build once and apply to many batches of Kafka rows."""
    options = {"mode": "PERMISSIVE", **({"avroSchema": reader_json} if reader_json else {})}
    value = F.col("value")
    header_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    framed_ok = value.isNotNull() & (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(bytearray(b"\x00")))
    if max_bytes:
        framed_ok = framed_ok & (F.length(value) <= max_bytes)
    body = F.expr("substring(value, 6)")
    with_alert = select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").alias("kafka_key"), F.col("value").alias("kafka_value"),
        F.when(framed_ok, header_id).alias("schema_id"),
        F.when(framed_ok & (header_id == schema_id), from_avro(body, schema_json, options))
        .alias("_alert"),
    )
    reason = (F.when(F.col("kafka_value").isNull(), F.lit("null value"))
              .when(F.length("kafka_value") == 0, F.lit("zero-length value"))
              .when(F.length("kafka_value") < 5, F.lit("shorter than the 5-byte wire-format header"))
              .when(F.length("kafka_value") > F.lit(max_bytes or 2**31 - 1),
                    F.format_string(f"oversized: %d bytes, over stream.max_alert_bytes ({max_bytes})",
                                    F.length("kafka_value")))
              .when(F.substring("kafka_value", 1, 1) != F.lit(bytearray(b"\x00")),
                    F.lit("wrong magic byte (not Confluent wire format)"))
              .when(F.col("schema_id") != schema_id,
                    F.format_string(f"schema id %d, but this topic carries schema id {schema_id}", "schema_id"))
              .when(F.col("_alert").isNull(), F.lit("Avro body does not decode with the topic's schema")))
    flat = select(*KAFKA_COLUMNS, "schema_id", reason.alias("reject_reason"), "_alert.*")
    alert_fields = [field["name"] for field in json.loads(reader_json or schema_json)["fields"]]
    # PERMISSIVE from_avro gives a record of nulls for a body it cannot read: no alert id means no alert.
    reject = F.coalesce(F.col("reject_reason"), F.when(F.expr(columns.alert_id).isNull(), F.lit(
        "Avro body does not decode with the topic's schema (no alert id)")))
    derived = select(
        night_of(F.expr(columns.time_mjd), night_offset_hours).alias("night"),
        F.expr(columns.visit_id).cast("long").alias("visit_id"),
        F.expr(columns.alert_id).cast("string").alias("alert_id"),
        *[reject.alias(c) if c == "reject_reason" else F.col(f"`{c}`")
          for c in [*KAFKA_COLUMNS, "schema_id", "reject_reason", *alert_fields]],
    )
    return [with_alert, flat, derived]
