"""Per-broker subscriptions on a real stream: per-visit caps across batches, and the ``lite`` format."""

from __future__ import annotations

import io
import json
from collections import Counter

import fastavro
import pytest

from conftest import decode_messages, saying, stream_args, stream_folder
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry
from skyfilter.schemas.avro import rubin_schema
from skyfilter.schemas.wire import unframe

TOPIC = "subs.alerts"
LITE_SQL = """-- the lite payload: four columns
SELECT alert_id, diaSource.ra, diaSource.dec AS decl,
       diaSource.snr * 2 AS double_snr
FROM alerts
WHERE diaSource.snr > 20
"""
BROKERS = """
brokers:
  subs_cap3:
    filters: [everything]
    max_alerts_per_visit: 3
  subs_all:
    filters: [everything]
    max_alerts_per_visit: null
  subs_lite:
    filters: [lite_bright]
    format: lite
    topic: subs.lite
    max_alerts_per_visit: null
"""


@pytest.fixture(scope="module")
def subs(kafka_cfg, spark, tmp_path_factory):
    folder = stream_folder(tmp_path_factory.mktemp("subs"),
                           {"everything.sql": "alert_id IS NOT NULL", "lite_bright.sql": LITE_SQL}, BROKERS)
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=3, alerts_per_visit=40, interval_s=0.0, stamps=False,
                                      seed=11, night="2026-11-20", progress=False))
    lines: list[str] = []
    # 20 offsets per batch: every visit is spread over several batches, so the cap must hold across them
    with saying(lines):
        totals = run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml",
                                 extra=["--set", "stream.max_offsets_per_trigger=20"]), spark)
    records = decode_messages(read_topic(kafka_cfg, TOPIC), rubin_schema("10.0"))
    return {"cfg": kafka_cfg, "totals": totals, "lines": lines,
            "records": {str(r["diaSourceId"]): r for r in records}, "tables": kafka_cfg.delta_dir / TOPIC}


def test_a_capped_broker_gets_exactly_its_cap_per_visit_across_batches(subs, spark):
    assert subs["totals"].batches >= 6
    visit_of = {alert_id: r["diaSource"]["visit"] for alert_id, r in subs["records"].items()}
    capped = read_topic(subs["cfg"], "filtered.subs_cap3")
    per_visit = Counter(visit_of[m.headers["alert_id"]] for m in capped)
    assert sorted(per_visit.values()) == [3, 3, 3] and len(set(visit_of.values())) == 3
    assert len({m.headers["alert_id"] for m in capped}) == 9
    uncapped = read_topic(subs["cfg"], "filtered.subs_all")
    assert sorted(m.headers["alert_id"] for m in uncapped) == sorted(subs["records"])


def test_dropped_by_cap_is_recorded_per_broker_and_visit(subs, spark):
    rows = (spark.read.format("delta").load(str(subs["tables"] / "broker_visits"))
            .groupBy("broker", "visit_id").sum("matched", "delivered", "dropped_by_cap").collect())
    by_key = {(r["broker"], r["visit_id"]): (r[2], r[3], r[4]) for r in rows}
    visits = sorted({r["diaSource"]["visit"] for r in subs["records"].values()})
    assert {by_key[("subs_cap3", v)] for v in visits} == {(40, 3, 37)}
    assert {by_key[("subs_all", v)] for v in visits} == {(40, 40, 0)}
    assert subs["totals"].dropped_by_cap["subs_cap3"] == 111
    assert any("over max_alerts_per_visit, not sent: subs_cap3" in line for line in subs["lines"])


def test_lite_messages_decode_with_their_registered_schema_to_the_selected_columns(subs):
    messages = read_topic(subs["cfg"], "subs.lite")
    expected = {i for i, r in subs["records"].items() if r["diaSource"]["snr"] > 20}
    assert len(expected) > 5 and sorted(m.headers["alert_id"] for m in messages) == sorted(expected)
    registry = open_registry(subs["cfg"])
    for message in messages:
        schema_id, body = unframe(message.value)
        schema = json.loads(registry.schema(schema_id))
        decoded = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema), None)
        source = subs["records"][message.headers["alert_id"]]["diaSource"]
        assert list(decoded) == ["alert_id", "ra", "decl", "double_snr", "matched_filters"]
        assert decoded == {"alert_id": int(message.headers["alert_id"]), "ra": source["ra"], "decl": source["dec"],
                           "double_snr": pytest.approx(source["snr"] * 2),
                           "matched_filters": message.headers["filters"].split(",")}
        assert len(message.value) < 60 + len(message.headers["filters"])
