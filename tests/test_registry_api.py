"""The embedded registry as standard clients see it: confluent-kafka's SchemaRegistryClient, AvroSerializer
and AvroDeserializer against `skyfilter registry serve`, backed by the real Kafka topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import StringSerializer

from conftest import DATA, ROOT, consume_avro, port_base, snr_as_string
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.topics import ensure_topics
from skyfilter.local.kafka import free_port_pair
from skyfilter.registry.client import ConfluentRegistry, KafkaTopicRegistry
from skyfilter.schemas.avro import avro_files, read_container, rubin_schema, schema_text

V1 = {"type": "record", "name": "candidate", "namespace": "test", "fields": [{"name": "snr", "type": "double"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "band", "type": "string", "default": "r"}]}
BREAKING = {**V1, "fields": [{"name": "flux", "type": "double"}]}


def test_subjects_versions_lookup_and_compatibility_through_the_confluent_client(registry_url, kafka_cfg):
    client = SchemaRegistryClient({"url": registry_url})
    subject = f"api-{uuid.uuid4().hex[:8]}-value"
    first = client.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    assert client.register_schema(subject, Schema(json.dumps(V1), "AVRO")) == first  # same schema: same id
    second = client.register_schema(subject, Schema(json.dumps(V2), "AVRO"))
    assert client.get_versions(subject) == [1, 2]
    assert subject in client.get_subjects()
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, second)
    assert client.get_version(subject, 1).schema_id == first
    assert json.loads(client.get_schema(first).schema_str) == V1
    found = client.lookup_schema(subject, Schema(json.dumps(V1), "AVRO"))
    assert (found.version, found.schema_id) == (1, first)
    with pytest.raises(SchemaRegistryError) as missing:
        client.get_latest_version(f"nobody-{uuid.uuid4().hex[:6]}-value")
    assert missing.value.error_code == 40401 and missing.value.http_status_code == 404

    assert client.get_compatibility() == "NONE"  # conf/local.yaml: Rubin's versions are not BACKWARD
    assert client.set_compatibility(subject, "BACKWARD") == {"compatibility": "BACKWARD"}  # the client returns the body
    assert client.get_compatibility(subject) == "BACKWARD"
    assert not client.test_compatibility(subject, Schema(json.dumps(BREAKING), "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(BREAKING), "AVRO"))
    assert refused.value.http_status_code == 409 and "flux: not written and without a default" in str(refused.value)
    assert client.get_versions(subject) == [1, 2]
    # the data is in the topic: another registry instance ("machine") sees it all
    other = KafkaTopicRegistry(kafka_cfg)
    assert other.versions(subject) == [first, second] and other.compatibility(subject) == "BACKWARD"


def test_avro_serializer_and_deserializer_round_trip_through_kafka(registry_url, kafka_cfg):
    client = SchemaRegistryClient({"url": registry_url})
    topic = f"api.roundtrip.{uuid.uuid4().hex[:6]}"
    ensure_topics(kafka_cfg, {topic: 1})
    producer = SerializingProducer({"bootstrap.servers": kafka_cfg.bootstrap_servers,
                                    "key.serializer": StringSerializer(),
                                    "value.serializer": AvroSerializer(client, json.dumps(V2))})
    for index in range(3):
        producer.produce(topic, key=str(index), value={"snr": 10.0 * index, "band": "g"})
    assert producer.flush(20) == 0
    assert client.get_latest_version(f"{topic}-value").schema_id > 0  # auto-registered through the REST API
    records = consume_avro(kafka_cfg, registry_url, topic, 3)
    assert [r["snr"] for r in records] == [0.0, 10.0, 20.0] and {r["band"] for r in records} == {"g"}


def test_project_client_speaks_to_the_served_registry(registry_url):
    registry = ConfluentRegistry(registry_url)
    subject = f"proj-{uuid.uuid4().hex[:6]}-value"
    assert registry.latest(subject) is None
    schema = rubin_schema("10.0")
    schema_id = registry.register(subject, schema, same_alerts=True)
    assert registry.register(subject, schema, same_alerts=True) == schema_id
    assert registry.latest(subject)[0] == schema_id
    assert json.loads(registry.schema(schema_id)) == json.loads(schema_text(schema))
    with pytest.raises(SkyfilterError, match="are not a version of them"):
        registry.register(subject, read_container(avro_files([DATA / "ztf-3.3"])[0])[0], same_alerts=True)


def test_unreachable_registry_is_one_line_without_the_credentials():
    port = free_port_pair(port_base(28900))
    with pytest.raises(SkyfilterError) as failed:
        ConfluentRegistry(f"http://127.0.0.1:{port}", basic_auth="alice:s3cret-pw").latest("x-value")
    message = str(failed.value)
    assert message.startswith(f"cannot reach schema registry http://127.0.0.1:{port}") and "\n" not in message
    assert "s3cret" not in message


def test_registry_command_serves_and_lists(kafka_cfg, tmp_path):
    port = free_port_pair(port_base(28100))
    base = [sys.executable, "-m", "skyfilter.cli", "registry", "--set",
            f"kafka.bootstrap_servers={kafka_cfg.bootstrap_servers}", "--set", f"state_dir={kafka_cfg.state_dir}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(base[:4] + ["serve", "--port", str(port)] + base[4:], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        first = server.stdout.readline()
        assert f"schema registry serving http://127.0.0.1:{port}" in first, first
        client = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})
        subject = f"cli-{uuid.uuid4().hex[:6]}-value"
        schema_id = client.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    finally:
        server.terminate()
        server.wait(20)
    listed = subprocess.run(base[:4] + ["list"] + base[4:], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert f"{subject}: 1 version(s), schema ids {schema_id}; compatibility NONE" in listed.stdout
    assert listed.stdout.strip().splitlines()[-1].endswith(f"in topic '_skyfilter_schemas' at "
                                                          f"{kafka_cfg.bootstrap_servers}")



def test_deleting_versions_soft_then_permanent_through_the_confluent_client(registry_url, kafka_cfg):
    client = SchemaRegistryClient({"url": registry_url})
    subject = f"del-{uuid.uuid4().hex[:8]}-value"
    first = client.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    second = client.register_schema(subject, Schema(json.dumps(V2), "AVRO"))
    with pytest.raises(SchemaRegistryError) as not_soft:
        client.delete_version(subject, 1, permanent=True)
    assert not_soft.value.http_status_code == 404 and not_soft.value.error_code == 40407
    assert client.delete_version(subject, 1) == 1
    assert client.get_versions(subject) == [2], "version numbers do not move"
    assert client.get_version(subject, 2).schema_id == second
    assert json.loads(client.get_schema(first).schema_str) == V1, "a deleted version's schema keeps its id"
    assert KafkaTopicRegistry(kafka_cfg).versions(subject) == [second]
    with pytest.raises(SchemaRegistryError) as twice:
        client.delete_version(subject, 1)
    assert twice.value.error_code == 40406
    assert client.delete_version(subject, 1, permanent=True) == 1
    client = SchemaRegistryClient({"url": registry_url})  # the client caches what it registered: a fresh one
    third = client.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    assert third == first and client.get_version(subject, 3).schema_id == first, "registered again: a new version"
    assert client.get_versions(subject) == [2, 3]

    assert client.set_compatibility(subject, "FULL") == {"compatibility": "FULL"}
    assert client.get_compatibility(subject) == "FULL" and client.get_compatibility() == "NONE"
    assert client.delete_subject(subject) == [2, 3]
    assert subject not in client.get_subjects()
    assert client.delete_subject(subject, permanent=True) == [2, 3]
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_versions(subject)
    assert gone.value.error_code == 40401


def test_registry_check_and_delete_commands(kafka_cfg, tmp_path):
    topic = f"check.{uuid.uuid4().hex[:6]}"
    registry = KafkaTopicRegistry(kafka_cfg)
    good = registry.register(f"{topic}-value", rubin_schema("10.0"), same_alerts=True)
    files = {"v11": rubin_schema("11.1"), "bad": snr_as_string(), "ztf": read_container(
        avro_files([DATA / "ztf-3.3"])[0])[0]}
    for name, schema in files.items():
        (tmp_path / f"{name}.avsc").write_text(json.dumps(schema))
    base = [sys.executable, "-m", "skyfilter.cli", "registry"]
    where = ["--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir", str(kafka_cfg.state_dir)]

    def run(*arguments):
        return subprocess.run([*base, *arguments, *where], capture_output=True, text=True, cwd=ROOT, timeout=120)

    checked = {name: run("check", str(tmp_path / f"{name}.avsc"), "--topic", topic) for name in files}
    assert checked["v11"].returncode == 0 and "it would be the reader" in checked["v11"].stdout
    assert checked["bad"].returncode == 1
    assert "would dead-letter these alerts" in checked["bad"].stdout and "diaSource.snr" in checked["bad"].stdout
    assert checked["ztf"].returncode == 1 and "holds ZTF alerts; this stream reads Rubin alerts" in \
        checked["ztf"].stdout

    bad = registry.register(f"{topic}-value", snr_as_string())  # as a REST client does; the level is NONE
    deleted = run("delete", topic, "--version", "2")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == (f"{topic}-value: version(s) 2 soft-deleted (--permanent removes them for "
                                      f"good); schema id(s) {bad} no longer read by streams on this topic")
    assert registry.versions(f"{topic}-value") == [good]
    again = run("delete", topic, "--version", "2")
    assert again.returncode == 2 and again.stderr.strip() == (
        f"skyfilter registry: error: Subject '{topic}-value' Version 2 was soft deleted. Set permanent=true to "
        f"delete permanently")
    assert run("delete", topic, "--version", "2", "--permanent").returncode == 0
    missing = run("check")
    assert missing.returncode == 2 and missing.stderr.strip() == "skyfilter registry: error: registry check needs a " \
                                                                "schema file"
