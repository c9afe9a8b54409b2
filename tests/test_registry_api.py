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

from conftest import DATA, ROOT, consume_avro
from skyfilter.core.avro_schemas import avro_files, read_container, rubin_schema, schema_text
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.kafka_local import free_port_pair
from skyfilter.core.registry import ConfluentRegistry, KafkaTopicRegistry
from skyfilter.core.topics import ensure_topics

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
    port = free_port_pair(28900)
    with pytest.raises(SkyfilterError) as failed:
        ConfluentRegistry(f"http://127.0.0.1:{port}", basic_auth="alice:s3cret-pw").latest("x-value")
    message = str(failed.value)
    assert message.startswith(f"cannot reach schema registry http://127.0.0.1:{port}") and "\n" not in message
    assert "s3cret" not in message


def test_registry_command_serves_and_lists(kafka_cfg, tmp_path):
    port = free_port_pair(28100)
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

