"""Dead letters: every kind of bad input message goes to ``<topic>.deadletter`` with its reason and origin, and
to the ``rejects`` table; the good alerts around them are all delivered."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import fastavro
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from conftest import DATA, ROOT, decode_messages, saying, stream_args, write_files
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import avro_files, read_container, rubin_schema
from skyfilter.schemas.wire import frame, unframe

TOPIC = "dl.alerts"
MAX_BYTES = 200_000


def _good(cfg, night: str, seed: int):
    return produce(cfg, ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=20, interval_s=0.0, stamps=False,
                                       seed=seed, night=night, progress=False))


def test_bad_messages_become_dead_letters_and_good_ones_all_arrive(kafka_cfg, spark, tmp_path, registry_url):
    report = _good(kafka_cfg, "2026-10-01", 1)
    sample = next(m for m in read_topic(kafka_cfg, TOPIC))
    schema_id, body = unframe(sample.value)
    ztf_schema, ztf_records = read_container(avro_files([DATA / "ztf-3.3"])[0])
    ztf_body = next(ztf_records).body
    ztf_id = open_registry(kafka_cfg).register(subject_for("dl.ztf"), ztf_schema)  # another topic's schema
    bad = {
        b"garbage": (b"this is not an alert at all, just text", "wrong magic byte"),
        b"empty": (b"", "zero-length value"),
        b"magic": (b"\x01" + b"\x00" * 40, "wrong magic byte"),
        b"unknown-id": (frame(987654, body), "schema id 987654 is not registered for topic"),
        b"truncated": (frame(schema_id, body[: len(body) // 2]), "Avro body does not decode"),
        b"other-schema": (frame(schema_id, ztf_body), "Avro body does not decode"),
        b"other-topic": (frame(ztf_id, ztf_body), f"schema id {ztf_id} is not registered for topic '{TOPIC}'"),
        b"oversized": (frame(schema_id, body + b"\x00" * (MAX_BYTES + 1000)), "oversized: "),
        b"null-value": (None, "null value"),
    }
    producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers, "message.max.bytes": 2_000_000})
    for key, (value, _) in bad.items():
        producer.produce(TOPIC, key=key, value=value)
    assert producer.flush(30) == 0
    _good(kafka_cfg, "2026-10-02", 2)
    assert report.schema_id == schema_id

    write_files(tmp_path / "filters", {"everything.sql": "alert_id IS NOT NULL"})
    (tmp_path / "brokers.yaml").write_text("brokers:\n  dl_all:\n    filters: [everything]\n"
                                           "    max_alerts_per_visit: null\n")
    lines: list[str] = []
    with saying(lines):
        totals = run(stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml",
                                 extra=["--set", f"stream.max_alert_bytes={MAX_BYTES}"]), spark)
    # The archive (the default writer, delta-rs) reads each message's leading fields only: a body cut after them
    # is archived as it came, its bytes being what the archive keeps; delivery's dead letters still name it.
    archived_as_sent = {b"truncated"}
    assert totals.input_alerts == 49 and totals.rejected == 9 and totals.archived == 40 + len(archived_as_sent)

    inputs = {m.key: m for m in read_topic(kafka_cfg, TOPIC) if m.key in bad}
    letters = read_topic(kafka_cfg, f"{TOPIC}.deadletter")
    assert sorted(m.key for m in letters) == sorted(bad)
    for letter in letters:
        value, reason = bad[letter.key]
        assert letter.value == value
        assert letter.headers["reason"].startswith(reason), (letter.key, letter.headers["reason"])
        source = inputs[letter.key]
        assert (letter.headers["source_topic"], int(letter.headers["source_partition"]),
                int(letter.headers["source_offset"])) == (TOPIC, source.partition, source.offset)
        assert int(letter.headers["source_timestamp"]) == source.timestamp_ms
    # a dead letter that is Avro of a registered schema decodes with the standard client, through the registry
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    other = next(m for m in letters if m.key == b"other-topic")
    record = deserializer(other.value, SerializationContext(f"{TOPIC}.deadletter", MessageField.VALUE))
    assert record["candid"] == fastavro.schemaless_reader(io.BytesIO(ztf_body), ztf_schema, None)["candid"]

    good = [m for m in read_topic(kafka_cfg, TOPIC) if m.key not in bad]
    good_ids = sorted(str(r["diaSourceId"]) for r in decode_messages(good, rubin_schema("10.0")))
    delivered = sorted(m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.dl_all"))
    assert len(good_ids) == 40 and delivered == good_ids
    rejects = spark.read.format("delta").load(str(kafka_cfg.delta_dir / TOPIC / "rejects"))
    assert sorted(r.kafka_key for r in rejects.select("kafka_key").collect()) == sorted(set(bad) - archived_as_sent)
    alerts = spark.read.format("delta").load(str(kafka_cfg.delta_dir / TOPIC / "alerts"))
    assert [(r.kafka_key, r.kafka_value) for r in alerts.where("kafka_key = 'truncated'").collect()] == \
        [(b"truncated", bad[b"truncated"][0])]
    assert any(f"sent to '{TOPIC}.deadletter'" in line for line in lines)

    # `skyfilter consume` prints every dead letter, finding the Kafka from --state-dir alone; a body that does
    # not decode comes as base64 with the reason
    shown = subprocess.run([sys.executable, "-m", "skyfilter.cli", "consume", f"{TOPIC}.deadletter",
                            "--from-beginning", "--idle", "3", "--state-dir", str(kafka_cfg.state_dir)],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert shown.returncode == 0, shown.stderr
    printed = {base64.b64decode(m["value_base64"]) if "value_base64" in m else None: m
               for m in map(json.loads, shown.stdout.splitlines())}
    assert len(shown.stdout.splitlines()) == 9 and shown.stderr.strip().startswith(
        f"consumed 9 message(s) from '{TOPIC}.deadletter'")
    truncated = printed[bad[b"truncated"][0]]
    assert truncated["error"].startswith("the body does not decode with its schema")
    assert truncated["headers"]["reason"].startswith("Avro body does not decode")

    # the unregistered id gets registered (a readable version): the next start re-drives its letter, once
    unknown = next(m for m in letters if m.key == b"unknown-id")
    open_registry(kafka_cfg).register(subject_for(TOPIC), rubin_schema("10.0"), same_alerts=True,
                                      schema_id=987654)
    again: list[str] = []
    with saying(again):
        second = run(stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml",
                                 extra=["--set", f"stream.max_alert_bytes={MAX_BYTES}"]), spark)
    assert f"re-drove 1 dead letter(s) of schema id(s) 987654 to '{TOPIC}': the stream reads them now" in again
    assert second.input_alerts == 1 and second.rejected == 0
    redriven = [m for m in read_topic(kafka_cfg, TOPIC) if "redriven_from" in m.headers]
    assert [(m.key, m.value, m.headers["redriven_from"]) for m in redriven] == [
        (b"unknown-id", unknown.value, f"{TOPIC}.deadletter/{unknown.partition}/{unknown.offset}")]
    redelivered = [m for m in read_topic(kafka_cfg, "filtered.dl_all") if m.key == b"unknown-id"]
    assert len(redelivered) == 1
    third: list[str] = []
    with saying(third):
        third_run = run(stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml"), spark)
    assert third_run.input_alerts == 0
    assert not any(line.startswith("re-drove") for line in third), "a letter is re-driven once"
