"""What an on-call astronomer relies on, checked with Prometheus' own tools: the alert rules and their unit tests
(``promtool test rules``), the configurations, the exposition format, and the Kubernetes copy of the rules."""

from __future__ import annotations

import subprocess
import time
import urllib.request

import pytest
import yaml

from conftest import ROOT, port_base
from skyfilter.core.config import Config
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.read_positions import (
    consumer_group,
    marked_positions,
    past_checkpoint,
    read_to,
    start_positions,
)
from skyfilter.lanes.recent_latency import RecentLatency
from skyfilter.local.processes import free_port

PROMTOOL = ROOT / ".local" / "prometheus" / "bin" / "promtool"
RULES = ROOT / "conf" / "prometheus" / "rules.yml"


def group_offsets(cfg, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """A consumer group's committed offsets, as kafka_exporter and Burrow read them (an OffsetFetch; the group's
    coordinator may still be loading right after Kafka started: asked again)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    reader = Consumer({"bootstrap.servers": cfg.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        for attempt in range(10):
            try:
                return {tp.partition: tp.offset
                        for tp in reader.committed([TopicPartition(topic, p) for p in partitions], timeout=10)}
            except KafkaException:
                if attempt == 9:
                    raise
                time.sleep(1)
    finally:
        reader.close()


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], input=stdin, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_every_alert_rule_passes_its_promtool_unit_tests():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "tests/prometheus/rules_test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    rules = [rule["alert"] for rule in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]]
    unit_tests = (ROOT / "tests" / "prometheus" / "rules_test.yml").read_text()
    untested = [name for name in rules if f"alertname: {name}" not in unit_tests]
    assert not untested, f"rules without a promtool unit test: {untested}"
    assert {"SkyfilterStreamDown", "SkyfilterFallingBehind", "SkyfilterStalledWithBacklog",
            "SkyfilterDeliveryLatencyHigh", "SkyfilterFilterQuarantined", "SkyfilterDeadLettersRising",
            "SkyfilterArchiveBehind"} <= set(rules)


def test_the_shipped_prometheus_configurations_check():
    for config in (ROOT / "conf" / "prometheus" / "prometheus.yml", ROOT / "docker" / "prometheus.yml"):
        text = config.read_text().replace("/etc/prometheus/rules.yml", str(RULES))  # the compose mount
        copy = config.parent / f".{config.name}.check"
        copy.write_text(text)
        try:
            checked = promtool("check", "config", str(copy))
        finally:
            copy.unlink()
        assert checked.returncode == 0 and "SUCCESS: 8 rules found" in checked.stdout, checked.stdout + checked.stderr


def test_the_kubernetes_prometheus_rule_holds_the_same_rules():
    manifests = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "docker" / "k8s" / "monitoring.yaml").read_text())}
    assert manifests["PrometheusRule"]["spec"] == yaml.safe_load(RULES.read_text())
    stream = [d for d in yaml.safe_load_all((ROOT / "docker" / "k8s" / "skyfilter.yaml").read_text())
              if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "stream"][0]
    labels = stream["spec"]["template"]["metadata"]["labels"]
    assert labels[manifests["PodMonitor"]["spec"]["jobLabel"]] == "skyfilter-stream"


def test_promtool_accepts_what_the_endpoint_serves(tmp_path):
    """Every series kind the stream exports, after real observations, in the text format Prometheus scrapes."""
    cfg = Config.load(ROOT / "conf" / "local.yaml", {"monitoring.port": free_port(port_base(19900))})
    monitor = StreamMonitor(cfg, "night", "alerts")
    try:
        monitor.add_lane("realtime", tmp_path / "checkpoint", "realtime 5 minutes", rows_read=lambda: 7)
        monitor._delivered({"lane": "realtime", "kafka_timestamp_ms": 1_000,
                            "brokers": [{"broker": "fink", "filters": "bright,red"}]}, 1_120)
        monitor.show_quarantined(["broken"], ["bright", "red", "broken"])
        monitor.restarted("realtime")
        monitor._latency("realtime", [10.0, 20.0, 30.0], 40.0)
        monitor.heartbeat.labels("night").set(1.0)
        text = urllib.request.urlopen(monitor.url, timeout=10).read().decode()
    finally:
        monitor.close()
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), \
        checked.stdout + checked.stderr
    assert 'skyfilter_delivery_latency_seconds_bucket{broker="fink",lane="realtime",le="0.2",stream="night"} 1.0' \
        in text
    assert 'skyfilter_filter_matches_total{filter="red",lane="realtime",stream="night"} 1.0' in text
    assert 'skyfilter_filter_quarantined{filter="broken",stream="night"} 1.0' in text


def test_recent_latency_is_per_broker_over_the_last_minute():
    recent = RecentLatency(window_s=60)
    recent.add("lasair", 5.0, now=900.0)  # 110 s before the last: out of the window
    for i in range(100):
        recent.add("fink", 0.01 * (i + 1), now=1000.0 + i * 0.1)
    figures = recent.per_broker(now=1010.0)
    assert list(figures) == ["fink"] and figures["fink"]["deliveries"] == 100
    assert figures["fink"]["p50_s"] == pytest.approx(0.505) and figures["fink"]["p99_s"] == pytest.approx(0.9901)


def test_read_positions_take_the_furthest_known_and_start_where_a_new_name_starts(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    assert start_positions(checkpoint, "alerts", {0: 40, 1: 38}, "latest") == {0: 40, 1: 38}, \
        "a new name on a busy topic starts at its end: what was there is no lag"
    assert start_positions(checkpoint, "alerts", {0: 40, 1: 38}, "earliest") == {}
    assert start_positions(checkpoint, "alerts", {0: 40, 1: 38}, '{"alerts": {"0": 35, "1": -1}}') == \
        {0: 35, 1: 38}, "auto settles to offsets at the launch: what came before is no lag, what came since is"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"alerts":{"0":50,"1":45}}\n')
    (checkpoint / "commits" / "3").write_text('v1\n{}\n')
    assert start_positions(checkpoint, "alerts", {0: 60, 1: 60}, "latest") == {0: 50, 1: 45}, "a resumed stream"
    marks = {("alerts", 0): (57, 1_000, 7), ("other", 1): (999, 1_000, 1)}
    positions = marked_positions(lambda: marks, "alerts", {0: 40, 1: 38}, checkpoint)
    assert positions([0, 1]) == {0: 57, 1: 45}, "marks where the tasks read, else the checkpoint"
    assert past_checkpoint(positions([0, 1]), checkpoint, "alerts", {0: 40, 1: 38}) == 7, \
        "read since the last checkpoint: what the marks passed, not what the topic holds"
    assert past_checkpoint({0: 44, 1: 38}, tmp_path / "new", "alerts", {0: 40, 1: 38}) == 4, "new name: since start"
    assert read_to({0: 57, 1: 45}, {0: 57, 1: 45}) and not read_to({0: 57, 1: 45}, {0: 57, 1: 46, 2: 0})
    assert consumer_group("night", "realtime") == consumer_group("night", "delivery") == "skyfilter.night"
    assert consumer_group("night", "archive") == "skyfilter.night.archive"


def test_a_delivery_is_counted_per_broker_and_once_per_filter(tmp_path):
    cfg = Config.load(ROOT / "conf" / "local.yaml", {"monitoring.port": None})
    monitor = StreamMonitor(cfg, "night", "alerts")
    try:
        monitor._delivered({"lane": "realtime", "kafka_timestamp_ms": 10_000, "brokers": [
            {"broker": "fink", "filters": "bright,red"}, {"broker": "lasair", "filters": "bright"}]}, 10_250)
        value = monitor.registry.get_sample_value
        assert value("skyfilter_broker_messages_total", {"stream": "night", "lane": "realtime", "broker": "fink"}) == 1
        assert value("skyfilter_filter_matches_total", {"stream": "night", "lane": "realtime", "filter": "bright"}) \
            == 1, "an alert two brokers receive is one match of the filter"
        assert value("skyfilter_delivery_latency_seconds_sum",
                     {"stream": "night", "lane": "realtime", "broker": "lasair"}) == pytest.approx(0.25)
        assert monitor.snapshot["latency_last_minute"]["fink"]["p50_s"] == pytest.approx(0.25)
    finally:
        monitor.close()


def test_between_batches_the_lag_is_measured_in_seconds_and_committed_to_the_stream_group(kafka_cfg, tmp_path):
    from confluent_kafka import Producer

    from skyfilter.kafka.topics import ensure_topics

    topic = "ops.lag.alerts"
    ensure_topics(kafka_cfg, {topic: 2})
    producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    for i in range(10):
        producer.produce(topic, value=b"alert %d" % i, partition=i % 2, timestamp=int(time.time() * 1000) - 30_000)
    producer.flush(10)
    read = {0: 5, 1: 3}  # where the lane has read to: all of partition 0, two alerts of partition 1 unread
    cfg = kafka_cfg.with_values({"monitoring.lag_interval_s": 0.5})
    monitor = StreamMonitor(cfg, "lagging", topic)
    try:
        monitor.add_lane("realtime", tmp_path / "none", "realtime 5 minutes", committed=lambda _p: dict(read))
        monitor.tick()
        for expected in ({0: 5, 1: 3}, {0: 5, 1: 5}):
            read.update(expected)
            deadline = time.monotonic() + 20
            while True:
                committed = group_offsets(kafka_cfg, "skyfilter.lagging", topic, [0, 1])
                if committed == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert committed == expected
        time.sleep(1.5)
        state = monitor.lanes["realtime"]
        assert state.lag == {0: 0, 1: 0} and state.lag_seconds == {0: 0.0, 1: 0.0}
    finally:
        monitor.close()


def test_the_heartbeat_moves_while_idle_and_kafka_outage_seconds_add_up():
    cfg = Config.load(ROOT / "conf" / "local.yaml", {"monitoring.port": None})
    monitor = StreamMonitor(cfg, "night", "alerts")
    value = monitor.registry.get_sample_value
    try:
        monitor.tick({"realtime": True}, kafka_down=False)
        first = value("skyfilter_heartbeat_timestamp_seconds", {"stream": "night"})
        time.sleep(0.3)
        monitor.tick({"realtime": True}, kafka_down=True)
        time.sleep(0.3)
        monitor.tick({"realtime": False}, kafka_down=True)
        monitor.tick({"realtime": False}, kafka_down=False)
        assert value("skyfilter_heartbeat_timestamp_seconds", {"stream": "night"}) >= first + 0.6
        assert value("skyfilter_kafka_outage_seconds_total", {"stream": "night"}) == pytest.approx(0.3, abs=0.1)
        assert value("skyfilter_lane_running", {"stream": "night", "lane": "realtime"}) == 0
    finally:
        monitor.close()
