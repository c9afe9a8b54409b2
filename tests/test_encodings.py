"""Broker topics in the community brokers' own layouts, read with their own clients from PyPI.

* ``encoding: fink``: the schema in the key, the Avro body alone in the value,
  read by fink-client's ``AlertConsumer`` (``full`` and ``lite``);
* ``encoding: json``: one JSON object per message, read by the ``lasair``
  package's ``lasair_consumer`` (``lite``, ``nocutouts``);
* ``skyfilter consume`` recognises each layout by itself.

Every topic must hold exactly the alerts an independent evaluation selects,
with the fields the broker asked for.
"""

from __future__ import annotations

import json
import uuid

import pytest
from fink_client.consumer import AlertConsumer
from lasair import lasair_consumer

from conftest import decode_messages, stream_args, stream_folder
from skyfilter.core.brokers import load_brokers
from skyfilter.core.errors import SkyfilterError
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema
from skyfilter.tools.consume import ConsumeOptions, consume

TOPIC = "enc.alerts"
LITE_SQL = "SELECT alert_id, diaSource.snr AS snr, diaSource.ra AS ra FROM alerts WHERE diaSource.snr > 10"
BROKERS = """
max_alerts_per_visit: null
brokers:
  enc_fink_full:
    filters: [bright]
    encoding: fink
  enc_fink_lite:
    filters: [snr10]
    format: lite
    encoding: fink
  enc_json_lite:
    filters: [snr10, bright]
    format: lite
    encoding: json
  enc_json_nocutouts:
    filters: [bright]
    format: nocutouts
    encoding: json
"""


@pytest.fixture(scope="module")
def encoded(kafka_cfg, spark, tmp_path_factory):
    folder = stream_folder(tmp_path_factory.mktemp("encodings"),
                           {"bright.sql": "diaSource.snr > 20", "snr10.sql": LITE_SQL}, BROKERS)
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=20, interval_s=0, stamps=True, seed=61,
                                      night="2026-11-21", schema_version="10.0", progress=False))
    totals = run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml"), spark)
    assert totals.input_alerts == 40 and totals.rejected == 0
    inputs = read_topic(kafka_cfg, TOPIC)
    records = {str(r["diaSourceId"]): r for r in decode_messages(inputs, rubin_schema("10.0"))}
    bright = {i for i, r in records.items() if r["diaSource"]["snr"] > 20}
    snr10 = {i for i, r in records.items() if r["diaSource"]["snr"] > 10}
    assert bright and snr10 - bright
    return {"cfg": kafka_cfg, "records": records, "bright": bright, "snr10": snr10}


def _fink_read(cfg, topic: str) -> list[tuple[dict, str]]:
    consumer = AlertConsumer([topic], {"group.id": f"fink-{uuid.uuid4()}", "bootstrap.servers": cfg.bootstrap_servers},
                             survey="lsst")
    alerts = []
    try:
        while True:
            found, alert, key = consumer.poll(timeout=5)
            if found is None:
                return alerts
            alerts.append((alert, key))
    finally:
        consumer.close()


def _lasair_read(cfg, topic: str) -> list[dict]:
    consumer = lasair_consumer(cfg.bootstrap_servers, f"lasair-{uuid.uuid4()}", topic)
    messages = []
    try:
        while (message := consumer.poll(timeout=5)) is not None:
            assert message.error() is None
            messages.append(json.loads(message.value()))
    finally:
        consumer.close()
    return messages


def test_fink_client_reads_full_alerts_from_the_schema_in_the_key(encoded):
    alerts = _fink_read(encoded["cfg"], "filtered.enc_fink_full")
    assert {str(alert["diaSourceId"]) for alert, _ in alerts} == encoded["bright"]
    for alert, key in alerts:
        assert alert == encoded["records"][str(alert["diaSourceId"])], "the whole alert, cutouts included"
        assert json.loads(key)["name"] == "lsst.v10_0.alert"


def test_fink_client_reads_lite_records(encoded):
    alerts = _fink_read(encoded["cfg"], "filtered.enc_fink_lite")
    assert {str(alert["alert_id"]) for alert, _ in alerts} == encoded["snr10"]
    for alert, _ in alerts:
        assert isinstance(alert["alert_id"], int), "alert_id keeps diaSourceId's type (long)"
        source = encoded["records"][str(alert["alert_id"])]["diaSource"]
        assert alert["snr"] == pytest.approx(source["snr"]) and alert["ra"] == source["ra"]
        assert alert["matched_filters"] == ["snr10"]


def test_lasair_consumer_reads_json_records(encoded):
    lite = _lasair_read(encoded["cfg"], "filtered.enc_json_lite")
    assert {str(m["alert_id"]) for m in lite} == encoded["snr10"]
    for message in lite:
        alert_id = str(message["alert_id"])
        expected = ["snr10", "bright"] if alert_id in encoded["bright"] else ["snr10"]
        assert message["matched_filters"] == expected and isinstance(message["alert_id"], int)
        assert message["snr"] == pytest.approx(encoded["records"][alert_id]["diaSource"]["snr"])
    nocutouts = _lasair_read(encoded["cfg"], "filtered.enc_json_nocutouts")
    assert {str(m["diaSourceId"]) for m in nocutouts} == encoded["bright"]
    assert all("cutoutDifference" not in m and m["diaSource"]["diaSourceId"] == m["diaSourceId"] for m in nocutouts)


def test_skyfilter_consume_recognises_each_layout(encoded):
    for topic, encoding, count in (("filtered.enc_fink_full", "fink", len(encoded["bright"])),
                                   ("filtered.enc_json_lite", "json", len(encoded["snr10"]))):
        lines: list[str] = []
        report = consume(encoded["cfg"], ConsumeOptions(topic, from_beginning=True, idle_s=3), lines.append)
        assert report.messages == count and report.undecodable == 0
        assert {json.loads(line)["encoding"] for line in lines} == {encoding}


def test_an_unknown_encoding_or_json_full_is_one_clear_error(tmp_path):
    path = tmp_path / "brokers.yaml"
    path.write_text("brokers:\n  a:\n    filters: [x]\n    encoding: protobuf\n  b:\n    filters: [x]\n")
    with pytest.raises(SkyfilterError, match=r"brokers.yaml:3: broker 'a': encoding 'protobuf' is not one of "
                                             r"confluent, fink, json"):
        load_brokers(path)
    path.write_text("brokers:\n  a:\n    filters: [x]\n    encoding: json\n  b:\n    filters: [x]\n")
    with pytest.raises(SkyfilterError, match="encoding json needs format lite or nocutouts"):
        load_brokers(path)
