"""End to end on simulated Rubin alerts: real Kafka, real Spark, real Delta.

One produce + one --available-now run of pipelines/filter_stream.py; the tests
below check its topics and tables against an independent fastavro +
plain-Python evaluation of the same filters.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import fastavro
import pytest
from confluent_kafka import Producer
from pyspark.sql import functions as F

from conftest import (
    NEGATIVE_PY,
    check_topic,
    consume_avro,
    decode_messages,
    expected_deliveries,
    saying,
    stream_args,
    write_files,
)
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry
from skyfilter.schemas.avro import cutout_fields, rubin_schema
from skyfilter.schemas.wire import frame, unframe
from skyfilter.tools.consume import ConsumeOptions, consume

TOPIC = "sim.alerts"


SNR_POS_PY = '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr", "diaSource.isNegative"])
def snr_pos_py(snr, is_negative):
    return (snr > 20) & ~is_negative
'''

TYPO_PY = '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr", "diaSource.bandd"])
def typo_py(snr, band):
    return snr > 1
'''

BROKERS = """
max_alerts_per_visit: null  # these tests compare every match
brokers:
  sim_full:
    filters: [bright, negative]
    format: full
  sim_nocut:
    filters: [bright, snr_pos]
    format: nocutouts
  sim_pair:
    filters: [snr_pos_py]
    topic: sim.pair
  sim_broken:
    filters: [broken_syntax, typo, typo_py, bright]
  sim_lite:
    filters: [bright_lite]
    format: lite
"""

PREDICATES = {
    "bright": lambda a: a["diaSource"]["snr"] > 30 and a["diaSource"]["reliability"] > 0.5,
    "negative": lambda a: a["diaSource"]["psfFlux"] < 0,
    "snr_pos": lambda a: a["diaSource"]["snr"] > 20 and not a["diaSource"]["isNegative"],
}


@pytest.fixture(scope="module")
def sim(kafka_cfg, spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim")
    write_files(folder / "filters", {
        "bright.sql": "-- bright and reliable\ndiaSource.snr > 30\nAND diaSource.reliability > 0.5\n",
        "negative.py": NEGATIVE_PY,
        "snr_pos.sql": "diaSource.snr > 20 AND NOT diaSource.isNegative",
        "snr_pos_py.py": SNR_POS_PY,
        "broken_syntax.sql": "diaSource.snr >\n  AND (",
        "typo.sql": "diaSource.snr > 5\nAND diaSource.relability > 0.5",
        "typo_py.py": TYPO_PY,
        "bright_lite.sql": "SELECT alert_id, diaSource.snr, diaSource.band FROM alerts\n"
                           "WHERE diaSource.snr > 30 AND diaSource.reliability > 0.5",
    })
    (folder / "brokers.yaml").write_text(BROKERS)
    report = produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=60, interval_s=0.0,
                                               stamps=True, seed=7, night="2026-11-20", progress=False))
    bad = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    bad.produce(TOPIC, key=b"bad-magic", value=b"\x01" + b"\x00" * 40)
    bad.produce(TOPIC, key=b"bad-id", value=frame(report.schema_id + 1, b"\x02\x04"))
    bad.flush(10)
    lines: list[str] = []
    with saying(lines):
        totals = run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml"), spark)
    inputs = read_topic(kafka_cfg, TOPIC)
    good = [m for m in inputs if m.key not in (b"bad-magic", b"bad-id")]
    records = decode_messages(good, rubin_schema("10.0"))
    return {
        "cfg": kafka_cfg, "report": report, "totals": totals, "lines": lines, "inputs": inputs,
        "by_id": {str(r["diaSourceId"]): m for r, m in zip(records, good, strict=True)},
        "records": {str(r["diaSourceId"]): r for r in records},
        "tables": kafka_cfg.delta_dir / TOPIC,
    }


def test_every_produced_alert_reached_the_stream(sim):
    assert sim["report"].alerts == 120 and sim["report"].failures == 0
    assert len(sim["inputs"]) == 122
    assert sim["totals"].input_alerts == 122
    assert sim["totals"].rejected == 2


def test_full_topic_holds_exactly_the_expected_alerts_with_original_bytes(sim):
    expected = expected_deliveries(sim["records"], {"sim_full": [(n, PREDICATES[n]) for n in ("bright", "negative")]})
    assert len(expected["sim_full"]) > 10, "the test data should select a meaningful fraction"
    messages = read_topic(sim["cfg"], "filtered.sim_full")
    check_topic(messages, expected["sim_full"], sim["by_id"], full=True)


def test_nocutouts_topic_has_its_own_schema_and_the_same_fields(sim):
    expected = expected_deliveries(sim["records"], {"sim_nocut": [(n, PREDICATES[n]) for n in ("bright", "snr_pos")]})
    messages = read_topic(sim["cfg"], "filtered.sim_nocut")
    check_topic(messages, expected["sim_nocut"], sim["by_id"], full=False)
    registry = open_registry(sim["cfg"])
    for message in messages:
        schema_id, body = unframe(message.value)
        schema = json.loads(registry.schema(schema_id))
        assert schema_id != unframe(sim["by_id"][message.headers["alert_id"]].value)[0]
        assert not cutout_fields(schema)
        decoded = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema), None)
        original = dict(sim["records"][message.headers["alert_id"]])
        for cutout in ("cutoutDifference", "cutoutScience", "cutoutTemplate"):
            assert original.pop(cutout)
        assert decoded == original
        assert len(message.value) < len(sim["by_id"][message.headers["alert_id"]].value) / 5


def test_every_broker_topic_decodes_with_the_confluent_avro_deserializer(sim, registry_url):
    """What a community broker runs: SchemaRegistryClient + AvroDeserializer on the served embedded registry."""
    for topic in ("filtered.sim_full", "filtered.sim_nocut", "sim.pair", "filtered.sim_lite"):
        messages = read_topic(sim["cfg"], topic)
        decoded = consume_avro(sim["cfg"], registry_url, topic, len(messages))
        assert len(decoded) == len(messages) > 0, topic
        ids = sorted(str(alert["diaSourceId"] if "diaSourceId" in alert else alert["alert_id"]) for alert in decoded)
        assert ids == sorted(m.headers["alert_id"] for m in messages), topic
        for alert in decoded:
            original = sim["records"][str(alert.get("diaSourceId", alert.get("alert_id")))]
            if topic == "filtered.sim_lite":
                assert alert == {"alert_id": original["diaSourceId"], "snr": original["diaSource"]["snr"],
                                 "band": original["diaSource"]["band"], "matched_filters": ["bright_lite"]}
            else:
                assert alert["diaSource"]["snr"] == original["diaSource"]["snr"]
                assert ("cutoutDifference" in alert) == (topic != "filtered.sim_nocut")


def test_skyfilter_consume_prints_writes_and_reports_what_it_cannot_decode(sim, tmp_path):
    lines: list[str] = []
    report = consume(sim["cfg"], ConsumeOptions("filtered.sim_lite", from_beginning=True, idle_s=3), lines.append)
    delivered = read_topic(sim["cfg"], "filtered.sim_lite")
    assert report.messages == len(lines) == len(delivered) and report.undecodable == 0
    printed = [json.loads(line) for line in lines]
    assert sorted(str(p["alert"]["alert_id"]) for p in printed) == sorted(m.headers["alert_id"] for m in delivered)
    assert all(p["alert"]["matched_filters"] == ["bright_lite"] for p in printed)

    files = tmp_path / "nocut"
    options = ConsumeOptions("filtered.sim_nocut", from_beginning=True, idle_s=3, output_dir=files,
                             output_format="avro")
    report = consume(sim["cfg"], options, lines.append)
    assert report.written == report.messages == len(read_topic(sim["cfg"], "filtered.sim_nocut"))
    for path in files.glob("*.avro"):
        with open(path, "rb") as handle:
            [alert] = list(fastavro.reader(handle))
        assert alert["diaSource"] == sim["records"][str(alert["diaSourceId"])]["diaSource"]

    letters: list[str] = []
    report = consume(sim["cfg"], ConsumeOptions(f"{TOPIC}.deadletter", from_beginning=True, idle_s=3),
                     letters.append)
    assert report.undecodable == report.messages == 2
    for letter in map(json.loads, letters):  # the original bytes, the stream's reason, and why it cannot decode
        assert letter["headers"]["reason"] and letter["error"] and letter["value_base64"]

    command = subprocess.run([sys.executable, "-m", "skyfilter.cli", "consume", "filtered.sim_lite",
                              "--from-beginning", "--max-messages", "2", "--set",
                              f"kafka.bootstrap_servers={sim['cfg'].bootstrap_servers}", "--set",
                              f"state_dir={sim['cfg'].state_dir}"], capture_output=True, text=True, timeout=120)
    assert command.returncode == 0, command.stderr
    assert len(command.stdout.splitlines()) == 2
    assert command.stderr.strip().endswith("consumed 2 message(s) from 'filtered.sim_lite'")


def test_sql_and_python_filters_with_the_same_cut_select_the_same_alerts(sim):
    bootstrap = sim["cfg"]
    by_sql = {m.headers["alert_id"] for m in read_topic(bootstrap, "filtered.sim_nocut")
              if "snr_pos" in m.headers["filters"].split(",")}
    by_python = {m.headers["alert_id"] for m in read_topic(bootstrap, "sim.pair")}
    assert by_sql and by_sql == by_python


def test_broken_filters_are_reported_with_file_and_line_and_the_others_run(sim):
    problems = [line for line in sim["lines"] if line.startswith("filter problem:")]
    assert any("broken_syntax.sql:2: SQL syntax error" in p for p in problems), problems
    assert any("typo.sql:2: unknown column 'diaSource.relability' (did you mean 'diaSource.reliability'?)" in p
               for p in problems), problems
    assert any("typo_py.py:5: unknown column 'diaSource.bandd'" in p for p in problems), problems
    assert len(problems) == 3
    expected = expected_deliveries(sim["records"], {"sim_broken": [("bright", PREDICATES["bright"])]})
    messages = read_topic(sim["cfg"], "filtered.sim_broken")
    check_topic(messages, expected["sim_broken"], sim["by_id"], full=True)


def test_archive_holds_every_accepted_alert_once_partitioned_by_night(sim, spark):
    alerts = spark.read.format("delta").load(str(sim["tables"] / "alerts"))
    rows = alerts.select("alert_id", "night", "visit_id", "kafka_offset").collect()
    assert sorted(r.alert_id for r in rows) == sorted(sim["records"])
    assert {r.night for r in rows} == {"2026-11-20"}
    assert {r.visit_id for r in rows} == {2026112000001, 2026112000002}
    assert "night" in (spark.sql(f"DESCRIBE DETAIL delta.`{sim['tables'] / 'alerts'}`").first().partitionColumns)


def test_rejected_messages_are_kept_with_their_reason(sim, spark):
    rejects = spark.read.format("delta").load(str(sim["tables"] / "rejects")).collect()
    reasons = {bytes(r.kafka_key): r.reject_reason for r in rejects}
    assert set(reasons) == {b"bad-magic", b"bad-id"}
    assert "magic byte" in reasons[b"bad-magic"]
    assert "is not registered for topic" in reasons[b"bad-id"]


def test_matches_and_metrics_tables_agree_with_the_topics(sim, spark):
    matches = spark.read.format("delta").load(str(sim["tables"] / "matches"))
    per_broker = {r.broker: r["count"] for r in matches.groupBy("broker").count().collect()}
    for broker, topic in (("sim_full", "filtered.sim_full"), ("sim_pair", "sim.pair")):
        assert per_broker[broker] == len(read_topic(sim["cfg"], topic))
    metrics = spark.read.format("delta").load(str(sim["tables"] / "metrics"))
    delivery = metrics.where("lane = 'delivery'").collect()
    assert sum(m.input_alerts for m in delivery) == 122
    assert sum(m.matches for m in delivery) == matches.count()
    for m in delivery:
        assert 0 < m.latency_p50_ms <= m.latency_p99_ms <= m.latency_max_ms
        assert m.started_at <= m.delivered_at <= m.finished_at
    archive = metrics.where("lane = 'archive'").collect()
    assert sum(m.archived for m in archive) == 120 and sum(m.rejected for m in archive) == 2
    assert all(m.started_at <= m.finished_at and m.delivered_at is None for m in archive)
    first = matches.agg(F.min(F.unix_millis("delivered_at") - F.unix_millis("kafka_timestamp"))).first()[0]
    assert first > 0, "each match carries when it was delivered, after its input was appended"
