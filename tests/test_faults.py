"""Faults survived with nothing lost: a Kafka node killed mid-night on a 3-node cluster, Kafka
unreachable at start-up and gone for 30 s while the stream runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka.admin import ConfigResource

from conftest import (
    ROOT,
    decode_messages,
    fault_row,
    kafka_status_ports,
    listening_ports,
    port_base,
    saying,
    stream_args,
    write_files,
)
from skyfilter.core.config import Config
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.kafka.topics import admin_client
from skyfilter.local.kafka import LocalKafka, free_port_pair
from skyfilter.local.processes import wait_for_exit
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

pytestmark = pytest.mark.slow  # every test here runs Kafka clusters or the stream job

SNR_CUT = 15


def _fresh_cluster_config(tmp_path_factory, name: str, nodes: int, start_port: int) -> Config:
    cfg = Config.load(ROOT / "conf" / ("cluster.yaml" if nodes > 1 else "local.yaml"))
    cfg = cfg.with_values({"state_dir": str(tmp_path_factory.mktemp(name)),
                           "kafka.base_port": free_port_pair(port_base(start_port), nodes), "kafka.heap": "512m",
                           "topics.alerts_partitions": 3, "simulation.schema_version": "10.0"})  # decoded with it
    cfg = cfg.with_values({"kafka.bootstrap_servers": LocalKafka(cfg, nodes).bootstrap_servers})
    return cfg


@pytest.fixture(scope="module")
def cluster_cfg(tmp_path_factory):
    """A running 3-node KRaft cluster (replication 3, min.insync.replicas 2) for this module."""
    cfg = _fresh_cluster_config(tmp_path_factory, "cluster", 3, 21092)
    cluster = LocalKafka(cfg, 3)
    cluster.start()
    yield cfg
    cluster.stop(timeout=3)  # the last nodes of a quorum wait for each other; no need to in a test


def _filters(folder) -> None:
    write_files(folder / "filters", {"bright.sql": f"diaSource.snr > {SNR_CUT}"})
    (folder / "brokers.yaml").write_text("max_alerts_per_visit: null\nbrokers:\n  f_b:\n    filters: [bright]\n")


def _produce_in_background(cfg: Config, topic: str, visits: int, per_visit: int, interval_s: float,
                           first_visit: int = 1) -> tuple[threading.Thread, list]:
    reports: list = []
    thread = threading.Thread(target=lambda: reports.append(produce(cfg, ProduceOptions(
        topic=topic, visits=visits, alerts_per_visit=per_visit, interval_s=interval_s, stamps=True,
        seed=first_visit, night="2026-11-19", first_visit=first_visit, progress=False))))
    thread.start()
    return thread, reports


def _stream_in_background(cfg: Config, spark, topic: str, folder, idle_s: float) -> tuple[threading.Thread, list, dict]:
    lines: list[str] = []
    result: dict = {}

    def work():
        try:
            with saying(lines):
                result["totals"] = run(stream_args(cfg, topic, folder / "filters", folder / "brokers.yaml",
                                                   extra=["--trigger", "1s", "--stop-when-idle", str(idle_s),
                                                          "--starting-offsets", "earliest",
                                                          "--set", "stream.max_offsets_per_trigger=40",
                                                          "--set", "kafka.connect_wait_s=120"]),
                                       spark)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            result["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, lines, result


def _wait_for(lines: list[str], text: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not any(text in line for line in lines):
        assert time.time() < deadline, f"no '{text}' within {timeout} s: {lines[-5:]}"
        time.sleep(0.2)


def _outcome(cfg: Config, spark, topic: str, produced: int, fault: str) -> dict:
    """Archive and broker topic against an independent evaluation of the produced alerts."""
    records = decode_messages(read_topic(cfg, topic), rubin_schema("10.0"))
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > SNR_CUT}
    delivered = [m.headers["alert_id"] for m in read_topic(cfg, "filtered.f_b")]
    alerts = spark.read.format("delta").load(str(table_paths(cfg, topic)["alerts"]))
    return fault_row(fault, produced, alerts, delivered, expected)


def test_kafka_status_shows_the_ports_each_node_listens_on(cluster_cfg):
    """`skyfilter kafka status` with the default config (one node) still shows all three nodes, their real ports."""
    result = subprocess.run([sys.executable, "-m", "skyfilter.cli", "kafka", "status", "--state-dir",
                             str(cluster_cfg.state_dir)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = kafka_status_ports(result.stdout)
    nodes = LocalKafka(cluster_cfg, 3).nodes
    assert set(shown) == {1, 2, 3}, result.stdout
    for node in nodes:
        assert set(shown[node.node_id]) == listening_ports(node.pid()), (node.node_id, result.stdout)
    assert f"bootstrap servers {cluster_cfg.bootstrap_servers}" in result.stdout


def test_kafka_node_killed_mid_night(cluster_cfg, spark, tmp_path, fault_report):
    topic = "node.alerts"
    _filters(tmp_path)
    producer, reports = _produce_in_background(cluster_cfg, topic, visits=6, per_visit=40, interval_s=5.0)
    stream, lines, result = _stream_in_background(cluster_cfg, spark, topic, tmp_path, idle_s=10)
    _wait_for(lines, "batch 0:")

    cluster = LocalKafka(cluster_cfg, 3)
    admin = admin_client(cluster_cfg)
    metadata = admin.list_topics(topic, timeout=10)
    assert all(len(p.replicas) == 3 for p in metadata.topics[topic].partitions.values()), "replication 3"
    [configs] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert configs.result()["min.insync.replicas"].value == "2"
    leader = metadata.topics[topic].partitions[0].leader
    victim = next(n for n in cluster.nodes if n.node_id == leader)
    pid = victim.pid()
    os.kill(pid, signal.SIGKILL)
    assert wait_for_exit(pid, 10)
    killed_at_batch = sum(line.startswith("batch ") for line in lines)
    time.sleep(15)
    cluster.start()  # restarts only the killed node
    lines.append(f"node {victim.node_id} restarted")

    producer.join(180)
    assert reports and reports[0].alerts == 240 and reports[0].failures == 0, "acks=all: every send acknowledged"
    stream.join(300)
    assert not stream.is_alive() and "error" not in result, result.get("error")
    assert sum(line.startswith("batch ") for line in lines) > killed_at_batch, "the stream kept running"

    fault = f"kill -9 Kafka node {victim.node_id} of 3 (a partition leader) mid-night, restart 15 s later"
    row = _outcome(cluster_cfg, spark, topic, 240, fault)
    fault_report.append(row)
    assert row["archived"] == row["archive_rows"] == 240, "every alert archived exactly once:\n" + "\n".join(lines)
    assert row["expected"] > 0 and row["lost"] == 0, "every match delivered at least once"


def test_stream_never_reachable_is_one_clear_line(tmp_path):
    port = free_port_pair(port_base(23092))
    began = time.time()
    result = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "filter_stream.py"), "--bootstrap", f"127.0.0.1:{port}",
         "--state-dir", str(tmp_path), "--set", "kafka.connect_wait_s=6"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "does not answer yet: retrying every 5 s for up to 6 s" in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [f"filter_stream: error: cannot reach Kafka at 127.0.0.1:{port} "
                      "(Failed to get metadata: Local: Broker transport failure): is it running? "
                      "(`skyfilter kafka start`)"], errors
    assert time.time() - began < 60



def test_kafka_down_at_start_and_lost_for_30_s(tmp_path_factory, spark, tmp_path, fault_report):
    cfg = _fresh_cluster_config(tmp_path_factory, "outage", 1, 24092)
    cluster = LocalKafka(cfg)
    topic = "outage.alerts"
    _filters(tmp_path)
    try:
        stream, lines, result = _stream_in_background(cfg, spark, topic, tmp_path, idle_s=10)
        _wait_for(lines, "does not answer yet", 60)
        cluster.start()
        _produce_in_background(cfg, topic, visits=2, per_visit=40, interval_s=0)[0].join(120)
        _wait_for(lines, "batch 0:")
        while sum(int(line.split(":")[1].split()[0]) for line in lines if line.startswith("batch ")) < 80:
            time.sleep(0.5)

        cluster.stop()
        down_at = time.time()
        _wait_for(lines, "is unreachable: the stream waits", 60)
        time.sleep(max(0.0, 30 - (time.time() - down_at)))
        cluster.start()
        _wait_for(lines, "is reachable again after", 60)
        producer, reports = _produce_in_background(cfg, topic, visits=2, per_visit=40, interval_s=0, first_visit=3)
        producer.join(120)
        stream.join(300)
        assert not stream.is_alive() and "error" not in result, result.get("error")
        row = _outcome(cfg, spark, topic, 160, "Kafka down when the stream starts; then stopped for 30 s mid-night")
        fault_report.append(row)
        assert reports[0].failures == 0
        assert row["archived"] == row["archive_rows"] == 160, "every alert archived exactly once:\n" + "\n".join(lines)
        assert row["expected"] > 0 and row["lost"] == 0 and row["duplicated"] == 0
    finally:
        cluster.stop()
