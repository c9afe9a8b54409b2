"""The rows of the delivery log's tables (``matches``, ``metrics``, ``broker_visits``), from its JSON records.

The same rows the Spark log query makes (``skyfilter/archive/log_lane.py``),
typed as Spark stores them, so that either writer can append to a table the
other created.  Each table's keys: the last grows along a *source* (the input
offset along an input partition, the batch id along a lane's query), which is
what inserting once (``skyfilter/archive/delta_appends.py``) relies on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
WATCH_MATCH = pa.struct([("kind", pa.string()), ("name", pa.string()), ("version", pa.int64()),
                         ("source_id", pa.string()), ("source_name", pa.string()),
                         ("separation_arcsec", pa.float64()), ("credible_level", pa.float64()),
                         ("probability_density", pa.float64())])  # skyfilter/watch/columns.py MATCH_TYPE

MATCHES_SCHEMA = pa.schema([
    ("night", pa.string()), ("visit_id", pa.int64()), ("alert_id", pa.string()), ("broker", pa.string()),
    ("topic", pa.string()), ("filters", pa.list_(pa.string())), ("format", pa.string()),
    ("kafka_topic", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
    ("kafka_timestamp", TIMESTAMP), ("delivered_at", TIMESTAMP), ("lane", pa.string()), ("batch_id", pa.int64()),
    ("watch", pa.list_(WATCH_MATCH))])
METRICS_SCHEMA = pa.schema([  # skyfilter/plan/tables.py METRICS_SCHEMA
    ("stream", pa.string()), ("run_id", pa.string()), ("batch_id", pa.int64()), ("trigger", pa.string()),
    ("started_at", TIMESTAMP), ("delivered_at", TIMESTAMP), ("finished_at", TIMESTAMP),
    ("input_alerts", pa.int64()), ("rejected", pa.int64()), ("archived", pa.int64()), ("matches", pa.int64()),
    ("matches_by_broker", pa.map_(pa.string(), pa.int64())), ("matches_by_filter", pa.map_(pa.string(), pa.int64())),
    ("filter_errors", pa.map_(pa.string(), pa.string())), ("deliver_ms", pa.float64()),
    ("processing_ms", pa.float64()), ("latency_p50_ms", pa.float64()), ("latency_p95_ms", pa.float64()),
    ("latency_p99_ms", pa.float64()), ("latency_max_ms", pa.float64()), ("input_rows_per_second", pa.float64()),
    ("processed_rows_per_second", pa.float64()), ("kafka_lag", pa.map_(pa.int32(), pa.int64())),
    ("quarantined_filters", pa.list_(pa.string())), ("lane", pa.string()), ("query_id", pa.string())])
BROKER_VISITS_SCHEMA = pa.schema([
    ("night", pa.string()), ("visit_id", pa.int64()), ("broker", pa.string()), ("max_alerts_per_visit", pa.int64()),
    ("matched", pa.int64()), ("delivered", pa.int64()), ("dropped_by_cap", pa.int64()), ("batch_id", pa.int64()),
    ("query_id", pa.string())])


@dataclass(frozen=True)
class LogTable:
    """One table of the delivery log: its schema, its keys, the keys naming a key's source, its partition column."""

    name: str
    schema: pa.Schema
    keys: tuple[str, ...]
    sources: tuple[str, ...]
    partition_by: str | None


MATCHES = LogTable("matches", MATCHES_SCHEMA, ("night", "broker", "kafka_topic", "kafka_partition", "kafka_offset"),
                   ("kafka_topic", "kafka_partition"), "night")
METRICS = LogTable("metrics", METRICS_SCHEMA, ("lane", "query_id", "batch_id"), ("lane", "query_id"), None)
BROKER_VISITS = LogTable("broker_visits", BROKER_VISITS_SCHEMA, ("query_id", "broker", "visit_id", "batch_id"),
                         ("query_id",), "night")
LOG_TABLES = (MATCHES, BROKER_VISITS, METRICS)  # metrics last: a batch's figures are stored once its rows are


def _timestamp(ms: float | None) -> int | None:
    """Milliseconds since the epoch (possibly fractional) as Spark's ``timestamp_millis`` of their whole part, in
    microseconds."""
    return None if ms is None else int(ms) * 1000


def match_rows(record: dict, delivered_at_ms: int) -> list[dict]:
    """The ``matches`` rows of one ``match`` record (one per broker it went to); ``delivered_at_ms``: the record's
    own Kafka timestamp, written with the broker messages."""
    common = {key: record.get(key) for key in ("night", "visit_id", "alert_id", "kafka_topic", "kafka_partition",
                                               "kafka_offset", "lane", "batch_id")}
    common |= {"kafka_timestamp": _timestamp(record.get("kafka_timestamp_ms")),
               "delivered_at": _timestamp(delivered_at_ms)}
    return [common | {"broker": entry.get("broker"), "topic": entry.get("topic"), "format": entry.get("format"),
                      "filters": None if entry.get("filters") is None else entry["filters"].split(","),
                      "watch": None if entry.get("watch") is None else json.loads(entry["watch"])}
            for entry in record.get("brokers") or []]


def metrics_row(record: dict) -> dict:
    """The ``metrics`` row of one ``batch`` record."""
    row = {field: record.get(field) for field in METRICS_SCHEMA.names}
    started, delivered, finished = (record.get(f"{moment}_at_ms") for moment in ("started", "delivered", "finished"))
    row |= {"started_at": _timestamp(started), "delivered_at": _timestamp(delivered),
            "finished_at": _timestamp(finished),
            "deliver_ms": None if delivered is None or started is None else delivered - started,
            "processing_ms": None if finished is None or started is None else finished - started,
            "kafka_lag": None if record.get("kafka_lag") is None else
            [(int(partition), behind) for partition, behind in record["kafka_lag"].items()]}
    for name in ("matches_by_broker", "matches_by_filter", "filter_errors"):
        row[name] = None if row[name] is None else list(row[name].items())
    return row


def broker_visit_rows(record: dict) -> list[dict]:
    """The ``broker_visits`` rows of one ``batch`` record."""
    return [{field: visit.get(field) for field in BROKER_VISITS_SCHEMA.names} |
            {"batch_id": record.get("batch_id"), "query_id": record.get("query_id")}
            for visit in record.get("broker_visits") or []]


def table_rows(records: list[tuple[dict, int]]) -> dict[str, list[dict]]:
    """Every log table's rows of (record, its Kafka timestamp in ms) pairs; records of unknown kinds are left out."""
    rows: dict[str, list[dict]] = {table.name: [] for table in LOG_TABLES}
    for record, timestamp_ms in records:
        kind = record.get("kind")
        if kind == "match":
            rows["matches"] += match_rows(record, timestamp_ms)
        elif kind == "batch":
            rows["metrics"].append(metrics_row(record))
            rows["broker_visits"] += broker_visit_rows(record)
    return rows
