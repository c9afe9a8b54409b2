"""The delivery-log tables written without Spark (delta-rs): the rows the Spark log query makes, each once."""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import DeltaTable

from skyfilter.archive.delta_appends import KeyedAppends
from skyfilter.archive.log_rows import BROKER_VISITS, MATCHES, METRICS, LogTable, table_rows

WATCH = [{"kind": "watchlist", "name": "grb", "version": 3, "source_id": "s1", "source_name": "GRB 1",
          "separation_arcsec": 1.5, "credible_level": None, "probability_density": None}]
MATCH = {"kind": "match", "lane": "realtime", "batch_id": 7, "night": "2026-11-10", "visit_id": 11,
         "alert_id": "101", "kafka_topic": "alerts", "kafka_partition": 1, "kafka_offset": 40,
         "kafka_timestamp_ms": 1_794_000_000_123,
         "brokers": [{"broker": "b1", "topic": "filtered.b1", "format": "avro", "filters": "f1,f2",
                      "watch": json.dumps(WATCH)},
                     {"broker": "b2", "topic": "filtered.b2", "format": "json", "filters": "f3", "watch": None}]}
BATCH = {"kind": "batch", "stream": "s", "lane": "delivery", "query_id": "q1", "run_id": "r1", "batch_id": 4,
         "trigger": "0s", "started_at_ms": 1_794_000_000_000.5, "delivered_at_ms": 1_794_000_000_200.0,
         "finished_at_ms": 1_794_000_000_300.9, "input_alerts": 10, "rejected": 1, "archived": None, "matches": 3,
         "matches_by_broker": {"b1": 2, "b2": 1}, "matches_by_filter": {"f1": 2}, "filter_errors": {},
         "latency_p50_ms": 50.0, "latency_p95_ms": 80.0, "latency_p99_ms": 90.0, "latency_max_ms": 95.0,
         "input_rows_per_second": None, "processed_rows_per_second": 33.3, "kafka_lag": {"0": 5, "1": 0},
         "quarantined_filters": ["bad"],
         "broker_visits": [{"night": "2026-11-10", "visit_id": 11, "broker": "b1", "max_alerts_per_visit": 2,
                            "matched": 3, "delivered": 2, "dropped_by_cap": 1}]}
DELIVERED_AT_MS = 1_794_000_000_250


def test_log_rows_are_those_of_the_spark_log_query_and_either_writer_appends_to_the_other_s_table(spark, tmp_path):
    from skyfilter.archive.insert_once import insert_new
    from skyfilter.archive.log_lane import log_broker_visits, log_matches, log_metrics
    from skyfilter.lanes.delivery_log import batch_records

    rows = table_rows([(MATCH, DELIVERED_AT_MS), (BATCH, DELIVERED_AT_MS), ({"kind": "unknown"}, 0)])
    logged = spark.createDataFrame([(json.dumps(MATCH), DELIVERED_AT_MS), (json.dumps(BATCH), DELIVERED_AT_MS)],
                                   "json string, ms long").selectExpr("json", "timestamp_millis(ms) AS timestamp")
    by_spark = {"matches": log_matches(logged), "metrics": log_metrics(batch_records(logged)),
                "broker_visits": log_broker_visits(batch_records(logged))}
    for table in (MATCHES, METRICS, BROKER_VISITS):
        path = tmp_path / table.name
        KeyedAppends(path, table).insert(rows[table.name], "rs", {0: 2})
        stored = spark.read.format("delta").load(str(path))
        expected = by_spark[table.name]
        assert stored.columns == expected.columns, table.name
        assert sorted(map(str, stored.collect())) == sorted(map(str, expected.collect())), table.name
        # Spark appends to the table delta-rs created, and delta-rs after it (new rows: their growing key moved on)
        growing = table.keys[-1]
        insert_new(expected.withColumn(growing, expected[growing] + 100), path, list(table.keys), "spark", 0,
                   table.partition_by)
        again = [row | {growing: row[growing] + 200} for row in rows[table.name]]
        assert KeyedAppends(path, table).insert(again + rows[table.name], "rs", {0: 3}) == len(again)
        assert spark.read.format("delta").load(str(path)).count() == 3 * len(rows[table.name]), table.name
    assert len(rows["matches"]) == 2 and len(rows["metrics"]) == 1 and len(rows["broker_visits"]) == 1


TABLE = LogTable("t", pa.schema([("night", pa.string()), ("broker", pa.string()), ("kafka_partition", pa.int32()),
                                 ("kafka_offset", pa.int64()), ("batch_id", pa.int64())]),
                 ("night", "broker", "kafka_partition", "kafka_offset"), ("kafka_partition",), "night")


def _rows(rows: list[tuple]) -> list[dict]:
    return [dict(zip(TABLE.schema.names, row, strict=True)) for row in rows]


def test_each_row_is_stored_once_however_often_the_log_repeats_it(tmp_path):
    """A delivery batch logged twice (it was retried), in the same or a later batch, and a batch written again
    after a crash: each row is stored once, before and after a restart (marks read back from the table)."""
    path = tmp_path / "t"
    first = [("2026-11-10", "b1", 0, 10, 1), ("2026-11-10", "b2", 0, 10, 1), ("2026-11-10", "b1", 1, 11, 1)]
    again = first[1:] + [("2026-11-10", "b1", 1, 12, 2), ("2026-11-11", "b1", 0, 3, 2)]
    later = [("2026-11-10", "b1", 0, 20, 3), ("2026-11-10", "b1", 2, 1, 3), ("2026-11-11", "b2", 0, 4, 3)]
    last = [("2026-11-10", "b1", 0, 21, 4)]

    def insert(appends: KeyedAppends, rows: list[tuple], offset: int) -> list[tuple]:
        appends.insert(_rows(rows), "test", {0: offset})
        return sorted(tuple(r.values()) for r in DeltaTable(str(path)).to_pyarrow_table(
            columns=TABLE.schema.names).to_pylist())

    running = KeyedAppends(path, TABLE)
    assert insert(running, first + first[:1], 1) == sorted(first)
    assert insert(running, again, 2) == sorted(first + again[2:]), "a retried delivery batch: its new rows only"
    assert insert(running, [], 3) == sorted(first + again[2:]), "an empty batch commits its offsets only"
    assert DeltaTable(str(path)).transaction_version("test:partition-0") == 3
    assert insert(running, later, 4) == sorted(first + again[2:] + later), "above the marks, a new partition"
    restarted = KeyedAppends(path, TABLE)
    assert insert(restarted, later[:1] + last, 5) == sorted(first + again[2:] + later + last), \
        "after a restart, the marks come from the table"


def test_a_drain_ends_when_a_log_partition_holds_nothing(kafka_cfg, tmp_path):
    """A stop drains the log to its end: an empty partition (no match delivered there yet) must not hold it."""
    import time

    from confluent_kafka import Producer

    from skyfilter.archive.log_rows import LOG_TABLES
    from skyfilter.archive.log_writer import LogWriter
    from skyfilter.kafka.clients import client_settings
    from skyfilter.kafka.topics import ensure_topics

    empty, half = "test.log-writer.empty", "test.log-writer.half"
    ensure_topics(kafka_cfg, {empty: 2, half: 2})
    producer = Producer(client_settings(kafka_cfg))
    for offset in range(3):
        producer.produce(half, json.dumps({**MATCH, "kafka_offset": offset}).encode(), partition=0)
    producer.flush(10)
    for topic, batches in ((empty, 0), (half, 1)):
        tables = {t.name: tmp_path / topic / t.name for t in LOG_TABLES}
        writer = LogWriter(kafka_cfg, f"drain-{batches}", topic, tables, 0.2, 100)
        writer.resume()
        began = time.monotonic()
        assert writer.run(lambda deadline=began + 60: time.monotonic() < deadline, available_now=True) == batches
        writer.close()
        assert time.monotonic() - began < 20, f"the drain of {topic} waited for a partition with nothing to read"
    rows = DeltaTable(str(tmp_path / half / "matches")).to_pyarrow_table().num_rows
    assert rows == 6, "three matches of two brokers each"
