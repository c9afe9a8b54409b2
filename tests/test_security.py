"""A secure local Kafka (SASL/SCRAM-SHA-512, standard authorizer): logins are required, each broker
reads only its own topic, and the pipeline still delivers everything."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from conftest import (
    ROOT,
    decode_messages,
    kafka_status_ports,
    listening_ports,
    port_base,
    saying,
    stream_args,
    write_files,
)
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.clients import client_settings, connect_as, credentials_dir
from skyfilter.kafka.read_back import read_topic
from skyfilter.local.kafka import LocalKafka, free_port_pair
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

pytestmark = pytest.mark.slow  # every test here runs Kafka clusters or the stream job

TOPIC = "alerts"  # the ACLs follow topics.alerts


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A running secure single-node Kafka whose principals come from a two-broker brokers.yaml."""
    folder = tmp_path_factory.mktemp("secure")
    write_files(folder / "filters", {"bright.sql": "diaSource.snr > 15", "every.sql": "true"})
    (folder / "brokers.yaml").write_text("max_alerts_per_visit: null\nbrokers:\n"
                                         "  sec_a:\n    filters: [bright]\n  sec_b:\n    filters: [every]\n")
    port = free_port_pair(port_base(25092))
    command = [sys.executable, "-m", "skyfilter.cli", "kafka", "start", "--config", str(ROOT / "conf" / "secure.yaml"),
               "--port", str(port), "--state-dir", str(folder / "state"), "--brokers", str(folder / "brokers.yaml"),
               "--set", "kafka.heap=512m"]
    started = subprocess.run(command, capture_output=True, text=True, timeout=180)
    cfg = Config.load(ROOT / "conf" / "secure.yaml", {"state_dir": str(folder / "state"),
                                                      "kafka.bootstrap_servers": f"127.0.0.1:{port}",
                                                      "simulation.schema_version": "10.0"})
    yield {"cfg": cfg, "folder": folder, "start": started}
    LocalKafka(cfg).stop()


def test_start_creates_principals_and_never_prints_secrets(secure):
    started = secure["start"]
    assert started.returncode == 0, started.stderr
    assert "5 principals and" in started.stdout and "ACLs in place" in started.stdout
    folder = credentials_dir(secure["cfg"])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for user in ("admin", "pipeline", "producer", "sec_a", "sec_b"):
        path = folder / f"{user}.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        password = json.loads(path.read_text())["password"]
        assert len(password) >= 24 and password not in started.stdout + started.stderr


def test_kafka_status_shows_the_secure_node_ports(secure):
    cfg = secure["cfg"]
    result = subprocess.run([sys.executable, "-m", "skyfilter.cli", "kafka", "status", "--config",
                             str(ROOT / "conf" / "secure.yaml"), "--state-dir", str(cfg.state_dir)],
                            capture_output=True, text=True, timeout=60)
    [node] = LocalKafka(cfg).nodes_on_disk()
    assert kafka_status_ports(result.stdout) == {1: (node.broker_port, node.controller_port)}
    assert listening_ports(node.pid()) == {node.broker_port, node.controller_port}
    assert f"bootstrap servers {cfg.bootstrap_servers}" in result.stdout


def test_unauthenticated_and_wrong_password_are_refused(secure):
    cfg = secure["cfg"]
    anonymous = AdminClient({"bootstrap.servers": cfg.bootstrap_servers, "log_level": 0})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=5)
    errors: list[KafkaError] = []
    wrong = AdminClient(client_settings(connect_as(cfg, "sec_a"), **{
        "sasl.password": "not-the-password", "log_level": 0, "error_cb": errors.append}))
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=10)
    wrong.poll(1)  # delivers the client's error events to error_cb
    assert any(e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str() for e in errors), errors
    right = AdminClient(client_settings(connect_as(cfg, "sec_a"), log_level=0))
    assert right.list_topics(timeout=10) is not None


def test_pipeline_delivers_and_each_broker_reads_only_its_own_topic(secure, spark):
    cfg, folder = secure["cfg"], secure["folder"]
    report = produce(cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=30, interval_s=0, stamps=True,
                                         seed=5, night="2026-11-18", progress=False))
    assert report.alerts == 60 and report.failures == 0
    lines: list[str] = []
    with saying(lines):
        totals = run(stream_args(cfg, TOPIC, folder / "filters", folder / "brokers.yaml",
                                 extra=["--config", str(ROOT / "conf" / "secure.yaml")]), spark)
    assert totals.archived == 60

    with pytest.raises(SkyfilterError, match="Topic authorization failed"):
        read_topic(connect_as(cfg, "sec_a"), TOPIC, group="sec_a")  # a broker cannot read the raw stream
    inputs = read_topic(connect_as(cfg, "pipeline"), TOPIC, group="spark-kafka-test")
    records = decode_messages(inputs, rubin_schema("10.0"))
    expected = {
        "sec_a": sorted(str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 15),
        "sec_b": sorted(str(r["diaSourceId"]) for r in records),
    }
    assert expected["sec_a"] and len(expected["sec_b"]) == 60
    for broker, other in (("sec_a", "sec_b"), ("sec_b", "sec_a")):
        mine = read_topic(connect_as(cfg, broker), f"filtered.{broker}", group=broker)
        assert sorted(m.headers["alert_id"] for m in mine) == expected[broker]
        with pytest.raises(SkyfilterError, match="Topic authorization failed"):
            read_topic(connect_as(cfg, broker), f"filtered.{other}", group=broker)
        with pytest.raises(SkyfilterError, match="[Gg]roup authorization failed"):
            read_topic(connect_as(cfg, broker), f"filtered.{broker}", group=other)  # nor use another's consumer group
    secrets = [json.loads(p.read_text())["password"] for p in credentials_dir(cfg).glob("*.json")]
    assert not [line for line in lines if any(secret in line for secret in secrets)]
