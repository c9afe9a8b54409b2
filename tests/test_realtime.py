"""Real-time Mode end to end: ``filter_stream.py --trigger realtime`` as an operator runs it.

Every broker goes through Spark's Real-time Mode: SQL filters, a Python filter
(the operator allowlist check off) and a per-visit cap (the stream's visit cap
ledger).  Every broker topic must equal an independent evaluation of the
produced alerts, the capped one within its cap across partitions and restarts,
and the archive lane must hold every alert once and every match with its
delivery time.  A Python filter that raises, hangs or returns the wrong length
is quarantined while the others deliver everything.
"""

from __future__ import annotations

import dataclasses
import json
import time
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
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import rubin_schema

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


def test_every_broker_in_realtime_mode_equals_an_independent_evaluation(kafka_cfg, spark, tmp_path):
    stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20", "snr10.sql": LITE_SQL,
                                       "negative.py": NEGATIVE_PY}, BROKERS)
    open_registry(kafka_cfg).register(subject_for(TOPIC), rubin_schema("10.0"), same_alerts=True)
    night = ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=30, interval_s=4.0, stamps=True, seed=31,
                           night="2026-11-14", progress=False)
    produce(kafka_cfg, night)  # before the stream: read from the topic's start
    job, lines = stream_process(kafka_cfg, TOPIC, tmp_path, [
        "--trigger", "realtime", "--archive-trigger", "2s", "--stop-when-idle", "12",
        "--set", "stream.realtime.checkpoint_interval=30s", "--set", "monitoring.port=null",
        "--set", "topics.alerts_partitions=3", "--starting-offsets", "earliest"])
    running_ms = time.time() * 1000
    produce(kafka_cfg, dataclasses.replace(night, visits=3, first_visit=2))
    bad = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    bad.produce(TOPIC, key=b"bad", value=b"not an alert")
    bad.flush(10)
    assert job.wait(timeout=400) == 0, "\n".join(lines[-30:])

    split = next(line for line in lines if "broker(s) in Real-time Mode" in line)
    assert "4 of 4 broker(s) in Real-time Mode" in split and "micro-batches" not in split, split
    assert any("Spark master local[2] -> local[3]" in line for line in lines), "one task slot per partition"
    rehearsed = next(line for line in lines if "realtime: rehearsed the night's query on" in line)
    assert "30 copied from the topic" in rehearsed, \
        "the night's query rehearsed on copies of the visit sent before the stream (which is delivered once, below)"

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
    assert sorted(per_visit.values()) == [3, 3, 3, 3]
    assert {m.headers["alert_id"] for m in capped} <= set(expected["rt_full"])
    [letter] = read_topic(kafka_cfg, f"{TOPIC}.deadletter")
    assert letter.key == b"bad" and "magic byte" in letter.headers["reason"]

    # Latency from the input's to the output's Kafka timestamps.  On 2 cores, while the archive runs its first
    # batches and at each checkpoint (every 30 s here), Real-time Mode waits for the CPU too; records still
    # leave one by one, the Python filter's too (Arrow batches of one alert): the fastest in a fraction of a
    # second, which no micro-batch here achieves, and half of them within a second.
    for topic in ("filtered.rt_full", "filtered.rt_lite", "filtered.rt_python"):
        latencies = sorted(m.latency_ms for m in read_topic(kafka_cfg, topic)
                           if int(m.headers["input_time"]) >= running_ms)
        assert latencies[0] < 250 and median(latencies) < 1000, f"{topic}: {latencies[:5]} ... ms"

    tables = table_paths(kafka_cfg, TOPIC)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    assert alerts.count() == 120 == alerts.select("alert_id").distinct().count()
    matches = spark.read.format("delta").load(str(tables["matches"]))
    lanes = {(r.broker, r.lane) for r in matches.select("broker", "lane").distinct().collect()}
    assert lanes == {("rt_full", "realtime"), ("rt_lite", "realtime"), ("rt_capped", "realtime"),
                     ("rt_python", "realtime")}
    assert matches.count() == matches.select("broker", "alert_id").distinct().count() == \
        len(expected["rt_full"]) + len(expected["rt_lite"]) + len(expected["rt_python"]) + 12


CAP_BROKERS = """
brokers:
  cap_tight:
    filters: [anything]
    max_alerts_per_visit: 4
  cap_roomy:
    filters: [bright]
    max_alerts_per_visit: 50
"""


def test_realtime_caps_hold_across_partitions_and_restarts(kafka_cfg, spark, tmp_path):
    """A visit's alerts arrive on every partition, each read by its own task; a run stopped before its first
    checkpoint is read again by the next one.  The tight broker gets 4 alerts per visit, the same 4 in both
    runs; the roomy one (under its cap) every match."""
    topic = "rtcap.alerts"
    stream_folder(tmp_path, {"anything.sql": "diaSource.snr > -1000000", "bright.sql": "diaSource.snr > 20"},
                  CAP_BROKERS)
    open_registry(kafka_cfg).register(subject_for(topic), rubin_schema("10.0"), same_alerts=True)
    options = ["--trigger", "realtime", "--lane", "delivery", "--stop-when-idle", "8",
               "--set", "stream.realtime.checkpoint_interval=10m", "--set", "monitoring.port=null"]
    kept_per_run, said = [], []
    for run in range(2):
        job, lines = stream_process(kafka_cfg, topic, tmp_path, options)
        said.append(lines)
        if run == 0:
            produce(kafka_cfg, ProduceOptions(topic=topic, visits=3, alerts_per_visit=15, interval_s=0.0,
                                              stamps=False, seed=41, night="2026-11-15", progress=False))
        assert job.wait(timeout=300) == 0, "\n".join(lines[-30:])
        kept_per_run.append(read_topic(kafka_cfg, "filtered.cap_tight"))

    inputs = read_topic(kafka_cfg, topic)
    assert len({m.partition for m in inputs}) > 1, "each visit spread over the topic's partitions"
    records = {str(r["diaSourceId"]): r for r in decode_messages(inputs, rubin_schema("10.0"))}
    first, both = kept_per_run
    assert len(both) > len(first), "the second run read the first one's alerts again (no checkpoint between)"
    per_visit = Counter(records[i]["diaSource"]["visit"] for i in {m.headers["alert_id"] for m in both})
    assert sorted(per_visit.values()) == [4, 4, 4], per_visit
    assert {m.headers["alert_id"] for m in first} == {m.headers["alert_id"] for m in both}, \
        "a restarted run admits the alerts the first one did, not others"
    bright = {i for i, r in records.items() if r["diaSource"]["snr"] > 20}
    assert bright and {m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.cap_roomy")} == bright
    ledger = [line for line in said[1] if "visit caps from the ledger" in line]
    assert ledger and f"({12 + len(bright)} admission(s)" in ledger[0], "the second run read the first's back"


QUARANTINE_FILTERS = {
    "everything.sql": "diaSource.snr > 3",
    "raises.py": '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.visit", "diaSource.snr"])
def raises(visit, snr):
    if (visit % 100000 >= 2).any():
        raise RuntimeError("visit 2 is too much for me")
    return snr > 3
''',
    "hangs.py": '''
import time

from skyfilter import alert_filter


@alert_filter(columns=["diaSource.visit", "diaSource.snr"])
def hangs(visit, snr):
    if (visit % 100000 >= 2).any():
        time.sleep(3600)
    return snr > 3
''',
    "wrong_length.py": '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.visit", "diaSource.snr"])
def wrong_length(visit, snr):
    if (visit % 100000 >= 2).any():
        return list(snr > 3) * 2
    return snr > 3
''',
}
QUARANTINE_BROKERS = """
max_alerts_per_visit: null
brokers:
  rq_all:
    filters: [everything]
  rq_mixed:
    filters: [raises, everything]
  rq_hangs:
    filters: [hangs]
  rq_wrong:
    filters: [wrong_length]
"""


def test_realtime_quarantines_python_filters_that_raise_hang_or_return_the_wrong_length(kafka_cfg, spark,
                                                                                        tmp_path):
    topic = "rtq.alerts"
    stream_folder(tmp_path, QUARANTINE_FILTERS, QUARANTINE_BROKERS)
    open_registry(kafka_cfg).register(subject_for(topic), rubin_schema("10.0"), same_alerts=True)
    job, lines = stream_process(kafka_cfg, topic, tmp_path, [
        "--trigger", "realtime", "--lane", "delivery", "--stop-when-idle", "15", "--set", "monitoring.port=null",
        "--set", "stream.realtime.checkpoint_interval=5s", "--set", "stream.filter_time_budget_s=2"])
    for visit in (1, 2, 3):
        produce(kafka_cfg, ProduceOptions(topic=topic, visits=1, first_visit=visit, alerts_per_visit=12,
                                          interval_s=0.0, stamps=False, seed=43, night="2026-11-16", progress=False))
        time.sleep(3)  # a visit is evaluated before the next comes: visit 1 never shares a call with visit 2
    assert job.wait(timeout=300) == 0, "\n".join(lines[-30:])

    said = "\n".join(lines)
    for name, reason in (("raises", "visit 2 is too much"), ("hangs", "2 s budget"), ("wrong_length", "values for")):
        assert any(f"filter '{name}' quarantined" in line and reason in line for line in lines), said
    assert "restarting the Real-time Mode query" in said, "the query goes on without them after a checkpoint"
    records = {str(r["diaSourceId"]): r for r in decode_messages(read_topic(kafka_cfg, topic), rubin_schema("10.0"))}
    expected = {i for i, r in records.items() if r["diaSource"]["snr"] > 3}
    assert len(records) == 36 and expected
    for broker in ("rq_all", "rq_mixed"):  # rq_mixed keeps its other filter
        assert {m.headers["alert_id"] for m in read_topic(kafka_cfg, f"filtered.{broker}")} == expected, broker
    for broker in ("rq_hangs", "rq_wrong"):
        delivered = {m.headers["alert_id"] for m in read_topic(kafka_cfg, f"filtered.{broker}")}
        assert delivered == {i for i in expected if records[i]["diaSource"]["visit"] % 100000 == 1}
    events = [json.loads(m.value) for m in read_topic(kafka_cfg, "skyfilter.errors")]
    mine = {e["filter"]: e for e in events if e["stream"] == topic}
    assert set(mine) == {"raises", "hangs", "wrong_length"} and mine["raises"]["broker"] == "rq_mixed"
    status = spark.read.format("delta").load(str(table_paths(kafka_cfg, topic)["filter_status"])).collect()
    assert sorted((r.filter, r.state) for r in status) == [("hangs", "quarantined"), ("raises", "quarantined"),
                                                          ("wrong_length", "quarantined")]


def test_the_idle_stop_sees_alerts_arrive_which_real_time_mode_reports_only_at_checkpoints(kafka_cfg):
    """A Real-time query reports its input at checkpoints minutes apart: the idle stop asks Kafka whether the
    topic grew (the demo once stopped while its second visit was arriving)."""
    import time

    from skyfilter.kafka.topics import ensure_topics
    from skyfilter.lanes.kafka_reachability import InputArrivals

    ensure_topics(kafka_cfg, {"rt.arrivals": 2})
    arrivals = InputArrivals(kafka_cfg, "rt.arrivals", interval_s=0.0)
    try:
        deadline = time.monotonic() + 10
        while not arrivals.has_baseline and time.monotonic() < deadline:
            assert arrivals.last_growth() == 0.0, "the first look is the baseline"
            time.sleep(0.2)
        assert arrivals.has_baseline, "Kafka never answered for a fresh topic"
        producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
        for key in (b"a", b"b", b"c"):
            producer.produce("rt.arrivals", key=key, value=b"x")
        assert producer.flush(10) == 0
        sent = time.time()
        grew = arrivals.last_growth()
        while grew == 0.0 and time.monotonic() < deadline + 10:  # one reading may fail as metadata settles
            time.sleep(0.2)
            grew = arrivals.last_growth()
        assert sent <= grew <= time.time()
        assert arrivals.last_growth() == grew, "no new alerts: the time stays"
    finally:
        arrivals.close()
