"""Fan-out: which brokers each alert goes to, and the Kafka messages that carry it there.

Every (alert, broker) match becomes one row with a ``topic`` column so one
Kafka sink serves every broker, and the dead-letter topic too.  ``full`` sends the input bytes unchanged;
``nocutouts`` and ``lite`` re-encode the alert under their own registered
schema (see ``pipelines/outputs.py``).  Headers: ``filters`` (matched filter names,
comma-separated), ``alert_id`` (for de-duplication) and ``input_time``
(input Kafka timestamp, ms, for end-to-end latency).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import to_avro

from pipelines.decode import is_accepted
from pipelines.filter_eval import add_filter_columns, filter_column
from skyfilter.brokers import BrokerSpec
from skyfilter.filter_loader import FilterSpec
from skyfilter.wire import frame

MATCHES = "_matches"


@dataclass(frozen=True)
class Encoding:
    """How a broker's messages are re-encoded: a registered schema and the columns that fill it."""

    schema_json: str
    schema_id: int
    columns: tuple[tuple[str, str], ...]  # (field name, SQL expression over the alert's columns)

    def value(self) -> Column:
        """The Confluent-framed Avro value of one alert under this encoding."""
        record = F.struct(*[F.expr(expression).alias(name) for name, expression in self.columns])
        return F.concat(F.lit(bytearray(frame(self.schema_id, b""))), to_avro(record, self.schema_json))


def add_matches(evaluated: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
    """Add ``_matches``: for each broker with at least one matching filter, its name, topic, format, filters."""
    entries = []
    for broker in brokers:
        if not broker.enabled_filters:
            continue
        names = F.array_compact(F.array(*[F.when(F.col(filter_column(f)), F.lit(f))
                                          for f in broker.enabled_filters]))
        entries.append(F.struct(F.lit(broker.name).alias("broker"), F.lit(broker.topic).alias("topic"),
                                F.lit(broker.format).alias("format"), names.alias("filters")))
    if not entries:
        return evaluated.withColumn(MATCHES, F.array().cast(
            "array<struct<broker:string,topic:string,format:string,filters:array<string>>>"))
    return evaluated.withColumn(MATCHES, F.filter(F.array(*entries), lambda m: F.size(m["filters"]) > 0))


def evaluate(decoded: DataFrame, filters: list[FilterSpec], brokers: list[BrokerSpec]) -> DataFrame:
    """Every filter's verdict and each alert's broker matches, for decoded rows (rejects match nothing)."""
    return add_matches(add_filter_columns(decoded, filters, is_accepted()), brokers)


def match_rows(with_matches: DataFrame) -> DataFrame:
    """One row per (alert, broker) match, keeping the alert's columns for encoding."""
    return (with_matches.where(F.size(MATCHES) > 0)
            .select("*", F.explode(MATCHES).alias("match")).drop(MATCHES))


def _header(key: str, value: Column) -> Column:
    return F.struct(F.lit(key).alias("key"), F.encode(value, "UTF-8").alias("value"))


def kafka_messages(matches: DataFrame, encodings: dict[str, Encoding]) -> DataFrame:
    """The rows the Kafka sink writes: topic, key, value, headers (brokers without an encoding get the input bytes)."""
    value = F.col("kafka_value")
    by_encoding: dict[Encoding, list[str]] = {}
    for broker, encoding in encodings.items():
        by_encoding.setdefault(encoding, []).append(broker)
    for encoding, brokers in by_encoding.items():
        value = F.when(F.col("match.broker").isin(brokers), encoding.value()).otherwise(value)
    headers = F.array(
        _header("filters", F.array_join("match.filters", ",")),
        _header("alert_id", F.col("alert_id")),
        _header("input_time", F.unix_millis("kafka_timestamp").cast("string")),
    )
    return matches.select(F.col("match.topic").alias("topic"), F.col("kafka_key").alias("key"),
                          value.alias("value"), headers.alias("headers"))


def deadletter_messages(evaluated: DataFrame, topic: str) -> DataFrame:
    """The input messages that did not decode, for the dead-letter topic: key and bytes unchanged, and headers
    ``reason``, ``source_topic``, ``source_partition``, ``source_offset``, ``source_timestamp`` (ms)."""
    headers = F.array(
        _header("reason", F.col("reject_reason")),
        _header("source_topic", F.col("kafka_topic")),
        _header("source_partition", F.col("kafka_partition").cast("string")),
        _header("source_offset", F.col("kafka_offset").cast("string")),
        _header("source_timestamp", F.unix_millis("kafka_timestamp").cast("string")),
    )
    return evaluated.where(~is_accepted()).select(F.lit(topic).alias("topic"), F.col("kafka_key").alias("key"),
                                                  F.col("kafka_value").alias("value"), headers.alias("headers"))
