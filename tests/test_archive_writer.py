"""The archive's alerts writer without Spark (``archive.writer: delta-rs``).

Its index columns are checked against a whole fastavro decode of real Rubin
and ZTF alerts and its reject reasons against the Spark lanes' list; its
appends against the session's Kafka and Spark: every message once across a
restart, and a table Spark reads and travels back in.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pyspark.sql import functions as F

from conftest import ROOT
from skyfilter.archive.alerts_writer import AlertsWriter, WriterSettings
from skyfilter.archive.delta_appends import stored_offsets
from skyfilter.archive.index_fields import IndexFields, leading_schema, night_of_mjd
from skyfilter.core.alert_columns import detect
from skyfilter.filtering.decode import night_of
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import read_container, rubin_schema, schema_text
from skyfilter.schemas.wire import frame

TOPIC = "archive-writer"


def _messages(folder, schema_id: int) -> tuple[dict, list[dict], list[dict]]:
    """(writer schema, Kafka-like rows of framed messages, the records as fastavro decodes them whole)."""
    schema, records, rows = None, [], []
    for path in sorted(folder.glob("*.avro"))[:12]:
        schema, found = read_container(path)
        for offset, record in enumerate(found, start=len(rows)):
            records.append(record.record)
            rows.append({"kafka_topic": "t", "kafka_partition": 0, "kafka_offset": offset, "kafka_timestamp": 0,
                         "kafka_key": None, "kafka_value": frame(schema_id, record.body)})
    return schema, rows, records


@pytest.mark.parametrize("sample", ["lsst-v10", "ztf-3.3"])
def test_index_columns_match_a_whole_decode_of_real_alerts(sample):
    schema, rows, records = _messages(ROOT / "samples" / sample, 7)
    columns = detect(schema)
    index = IndexFields(columns, 12.0)
    index.add_writer(7, schema_text(schema))
    batch = index.split(rows)
    assert not batch.rejected and len(batch.accepted) == len(records)
    for row, record in zip(batch.accepted, records, strict=True):
        if columns.family == "ztf":
            alert_id, mjd = record["candid"], record["candidate"]["jd"] - 2400000.5
            visit = round(mjd * 86400)
        else:
            alert_id, mjd, visit = record["diaSourceId"], record["diaSource"]["midpointMjdTai"], \
                record["diaSource"]["visit"]
        night = (dt.datetime(1858, 11, 17) + dt.timedelta(days=mjd - 0.5)).date().isoformat()
        assert (row["alert_id"], row["visit_id"], row["night"], row["schema_id"]) == (str(alert_id), visit, night, 7)


def test_the_leading_schema_stops_after_the_last_field_the_index_names():
    rubin = rubin_schema("10.0")
    names = [f["name"] for f in leading_schema(rubin, ["diaSourceId", "diaSource.midpointMjdTai",
                                                       "diaSource.visit"])["fields"]]
    assert names[-1] == "diaSource" and "prvDiaSources" not in names and "cutoutScience" not in names
    ztf_schema, _ = read_container(next((ROOT / "samples" / "ztf-3.3").glob("*.avro")))
    ztf = [f["name"] for f in leading_schema(ztf_schema, ["candid", "candidate.jd - 2400000.5"])["fields"]]
    assert ztf[-1] == "candidate" and "prv_candidates" not in ztf


def test_bad_messages_are_rejects_with_the_reasons_the_spark_lanes_give():
    schema, rows, _ = _messages(ROOT / "samples" / "lsst-v10", 7)
    index = IndexFields(detect(schema), 12.0, max_bytes=400_000)
    index.add_writer(7, schema_text(schema))
    index.reject_writer(8, "schema id 8: the reader cannot read it")
    good = rows[0]["kafka_value"]
    values = [None, b"", b"\x00\x00", b"\x01" + good[1:], frame(99, good[5:]), frame(8, good[5:]),
              frame(7, b"\xff" * 3), frame(7, good[5:]) + b"\x00" * 400_000, good]
    batch = index.split([{**rows[0], "kafka_offset": i, "kafka_value": v} for i, v in enumerate(values)])
    reasons = [r["reject_reason"] for r in sorted(batch.rejected, key=lambda r: r["kafka_offset"])]
    assert reasons == ["null value", "zero-length value", "shorter than the 5-byte wire-format header",
                       "wrong magic byte (not Confluent wire format)",
                       "schema id 99 is not registered for topic 't'", "schema id 8: the reader cannot read it",
                       "Avro body does not decode with its writer schema",
                       f"oversized: {len(values[7])} bytes, over stream.max_alert_bytes (400000)"]
    assert [r["kafka_offset"] for r in batch.accepted] == [8]


def test_the_night_is_the_one_spark_computes(spark):
    times = [60000.0, 60000.4999999, 60000.5, 60000.5000001, 61021.93, 59999.99999]
    expected = spark.createDataFrame([(t,) for t in times], "t double").select(
        night_of(F.col("t"), 12.0).alias("night")).collect()
    assert [night_of_mjd(t, 12.0) for t in times] == [r.night for r in expected]


def test_each_message_is_archived_once_across_restarts_and_spark_reads_the_table(kafka_cfg, spark, tmp_path):
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=15, interval_s=0, stamps=True,
                                      seed=71, night="2026-11-20", schema_version="10.0", progress=False))
    from skyfilter.filtering.input_schemas import registered_writers

    writers = registered_writers(kafka_cfg, TOPIC)
    tables = table_paths(kafka_cfg, "writer-test")
    settings = WriterSettings(topic=TOPIC, name="writer-test", tables=tables, delivery_log_topic=f"{TOPIC}.log",
                              trigger_s=0.5, max_alerts=10, night_offset_hours=12.0, max_alert_bytes=None,
                              starting_offsets="earliest")
    columns = detect(json.loads(next(iter(writers.values()))))

    def drain() -> AlertsWriter:
        writer = AlertsWriter(kafka_cfg, settings, columns, lambda: writers)
        writer.resume()
        writer.run(lambda: True, available_now=True)
        writer.close()
        return writer

    first = drain()
    assert first.batches >= 3, "batches of at most max_alerts messages"
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=12, interval_s=0, stamps=True,
                                      seed=72, night="2026-11-20", first_visit=3, schema_version="10.0",
                                      progress=False))
    drain()  # a restart: resumes from the offsets its commits hold
    assert drain().batches == 0, "nothing left: a third start reads nothing again"

    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    keys = alerts.select("kafka_partition", "kafka_offset").collect()
    assert len(keys) == len(set(keys)) == 42, "every message once"
    assert alerts.select("night").distinct().collect()[0].night == "2026-11-20"
    first_commit = spark.read.format("delta").option("versionAsOf", 0).load(str(tables["alerts"]))
    assert 0 < first_commit.count() <= 10, "time travel to the first batch"
    partitions = sorted({r.kafka_partition for r in keys})
    ends = {p: 1 + max(r.kafka_offset for r in keys if r.kafka_partition == p) for p in partitions}
    assert stored_offsets(tables["alerts"], first.app_id, TOPIC, partitions) == ends
    assert [r.schema_id for r in spark.read.format("delta").load(str(tables["schemas"])).collect()] == \
        list(writers)


def test_a_full_disk_is_told_from_other_write_errors():
    import errno

    from skyfilter.archive.topic_batches import disk_full

    assert disk_full(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    assert disk_full(RuntimeError("Generic LocalFileSystem error: Unable to copy data to file: File too large "
                                  "(os error 27)")) == "File too large (os error 27)"
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full(ValueError("Failed to parse parquet")) is None
