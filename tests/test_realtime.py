"""Real-time Mode end to end: ``filter_stream.py --trigger realtime`` as an operator runs it.

Brokers it can serve (SQL filters, no cap) go through Spark's Real-time Mode;
a capped broker and one with a Python filter go through micro-batches beside
it.  Every broker topic must equal an independent evaluation of the produced
alerts, the capped one within its cap, and the archive lane must hold every
alert once and every match with its delivery time.
"""

from __future__ import annotations

from collections import Counter
from statistics import median

from confluent_kafka import Producer

from conftest import (
    NEGATIVE_PY,
    check_topic,
    decode_messages,
    expected_deliveries,
    stream_folder,
    stream_process,
)
from skyfilter.core.avro_schemas import rubin_schema
from skyfilter.core.delivery import read_topic
from skyfilter.core.registry import open_registry, subject_for
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.stream.tables import table_paths

TOPIC = "rt.alerts"
LITE_SQL = "SELECT alert_id, diaSource.snr FROM alerts WHERE diaSource.snr > 10"
BROKERS = """
max_alerts_per_visit: null
brokers:
  rt_full:
    filters: [bright]
  rt_lite:
    filters: [snr10]
    format: lite
  rt_capped:
    filters: [bright]
    max_alerts_per_visit: 3
  rt_python:
    filters: [negative]
    format: nocutouts
"""
PREDICATES = {
    "bright": lambda a: a["diaSource"]["snr"] > 20,
    "snr10": lambda a: a["diaSource"]["snr"] > 10,
    "negative": lambda a: a["diaSource"]["psfFlux"] < 0,
}


def test_realtime_brokers_and_micro_batch_brokers_equal_an_independent_evaluation(kafka_cfg, spark, tmp_path):
    stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20", "snr10.sql": LITE_SQL,
                                       "negative.py": NEGATIVE_PY}, BROKERS)
    open_registry(kafka_cfg).register(subject_for(TOPIC), rubin_schema("10.0"), same_alerts=True)
    job, lines = stream_process(kafka_cfg, TOPIC, tmp_path, [
        "--trigger", "realtime", "--archive-trigger", "2s", "--stop-when-idle", "12",
        "--set", "stream.realtime.checkpoint_interval=30s", "--set", "monitoring.port=null",
        "--set", "topics.alerts_partitions=3"])
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=3, alerts_per_visit=30, interval_s=4.0, stamps=True,
                                      seed=31, night="2026-11-14", progress=False), log=lambda line: None)
    bad = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    bad.produce(TOPIC, key=b"bad", value=b"not an alert")
    bad.flush(10)
    assert job.wait(timeout=400) == 0, "\n".join(lines[-30:])

    split = next(line for line in lines if "broker(s) in Real-time Mode" in line)
    assert "2 of 4 broker(s) in Real-time Mode: rt_full, rt_lite" in split, split
    assert "rt_capped (max_alerts_per_visit 3)" in split and "rt_python (Python filter(s) negative)" in split
    assert any("Spark master local[2] -> local[5]" in line for line in lines), "one task slot per partition + 2"
    assert any("realtime: passed a first checkpoint boundary before the night" in line for line in lines), \
        "with a 30 s interval the query's cold first boundary passes at start-up"

    inputs = [m for m in read_topic(kafka_cfg, TOPIC) if m.key != b"bad"]
    records = {str(r["diaSourceId"]): r for r in decode_messages(inputs, rubin_schema("10.0"))}
    by_id = {str(r["diaSourceId"]): m for r, m in zip(records.values(), inputs, strict=True)}
    expected = expected_deliveries(records, {name: [(f, PREDICATES[f])] for name, f in (
        ("rt_full", "bright"), ("rt_lite", "snr10"), ("rt_python", "negative"))})
    assert expected["rt_full"] and expected["rt_lite"] and expected["rt_python"]
    check_topic(read_topic(kafka_cfg, "filtered.rt_full"), expected["rt_full"], by_id, full=True)
    check_topic(read_topic(kafka_cfg, "filtered.rt_lite"), expected["rt_lite"], by_id, full=False)
    check_topic(read_topic(kafka_cfg, "filtered.rt_python"), expected["rt_python"], by_id, full=False)
    capped = read_topic(kafka_cfg, "filtered.rt_capped")
    per_visit = Counter(records[m.headers["alert_id"]]["diaSource"]["visit"] for m in capped)
    assert sorted(per_visit.values()) == [3, 3, 3]
    assert {m.headers["alert_id"] for m in capped} <= set(expected["rt_full"])
    [letter] = read_topic(kafka_cfg, f"{TOPIC}.deadletter")
    assert letter.key == b"bad" and "magic byte" in letter.headers["reason"]

    # Latency from the input's to the output's Kafka timestamps.  On 2 cores, while the other lanes run their
    # first batches (Python workers, Delta commits, code compiled on first use) and at each checkpoint (every
    # 30 s here), Real-time Mode waits for the CPU too, so the check is relative: records leave one by one
    # (the fastest in a fraction of a second, which no micro-batch here achieves), and half of them sooner than
    # a third of the micro-batch brokers' median.
    realtime = sorted(m.latency_ms for topic in ("filtered.rt_full", "filtered.rt_lite")
                      for m in read_topic(kafka_cfg, topic))
    batched = sorted(m.latency_ms for m in read_topic(kafka_cfg, "filtered.rt_python"))
    assert realtime[0] < 250, f"Real-time Mode sends each record as it comes: fastest {realtime[:5]} ms"
    assert 3 * median(realtime) < median(batched), f"realtime {median(realtime)} ms, batches {median(batched)} ms"

    tables = table_paths(kafka_cfg, TOPIC)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    assert alerts.count() == 90 == alerts.select("alert_id").distinct().count()
    matches = spark.read.format("delta").load(str(tables["matches"]))
    lanes = {(r.broker, r.lane) for r in matches.select("broker", "lane").distinct().collect()}
    assert lanes == {("rt_full", "realtime"), ("rt_lite", "realtime"), ("rt_capped", "delivery"),
                     ("rt_python", "delivery")}
    assert matches.count() == matches.select("broker", "alert_id").distinct().count() == \
        len(expected["rt_full"]) + len(expected["rt_lite"]) + len(expected["rt_python"]) + 9
