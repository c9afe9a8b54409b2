"""One night through a real Spark standalone cluster (master + 2 workers) equals the same night in local mode.

The cluster run is the unchanged job under ``spark-submit --master spark://...``;
while it runs, its Prometheus endpoint is scraped and ``skyfilter status`` is
read, and both are checked against what was produced and what the local run
found.  The Delta metrics table must hold the same figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import yaml
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, port_base, stream_args
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.local.processes import free_port
from skyfilter.local.status import status_screen
from skyfilter.producers.command import ProduceOptions, produce

TOPIC = "cluster.alerts"
VISITS, PER_VISIT, BAD = 2, 40, 2


def _brokers_file(path, prefix: str) -> dict[str, str]:
    """The repository's brokers.yaml with every output topic renamed under ``prefix``; returns broker -> topic."""
    data = yaml.safe_load((ROOT / "conf" / "brokers.yaml").read_text())
    for name, broker in data["brokers"].items():
        broker["topic"] = f"{prefix}.{name}"
    path.write_text(yaml.safe_dump(data))
    return {name: broker["topic"] for name, broker in data["brokers"].items()}


def _scrape(url: str) -> dict[tuple, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _series(samples: dict, name: str, **labels) -> dict[tuple, float]:
    return {key: value for key, value in samples.items()
            if key[0] == name and all(dict(key[1]).get(k) == v for k, v in labels.items())}


def _table(spark, path):
    return spark.read.format("delta").load(str(path)).orderBy("kafka_partition", "kafka_offset").collect()


def test_a_night_on_a_standalone_cluster_equals_local_mode_and_is_monitored(kafka_cfg, spark, tmp_path,
                                                                             spark_standalone):
    standalone = spark_standalone
    night = "2026-11-20"
    options = dict(topic=TOPIC, visits=VISITS, alerts_per_visit=PER_VISIT, interval_s=0.0, stamps=True,
                   progress=False, night=night)
    produce(kafka_cfg, ProduceOptions(**options))
    producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    for i in range(BAD):
        producer.produce(TOPIC, value=b"not an alert %d" % i, key=b"bad")
    producer.flush(10)
    produced = VISITS * PER_VISIT + BAD
    filters = ROOT / "filters"

    local_topics = _brokers_file(tmp_path / "brokers.local.yaml", "cl.local")
    local = run(stream_args(kafka_cfg, TOPIC, filters, tmp_path / "brokers.local.yaml", name="cl_local"),
                spark)
    assert local.input_alerts == produced and local.rejected == BAD

    cluster_topics = _brokers_file(tmp_path / "brokers.cluster.yaml", "cl.cluster")
    metrics_port = free_port(port_base(19464))
    command = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", standalone.master_url,
               str(ROOT / "pipelines" / "filter_stream.py"), "--topic", TOPIC, "--name", "cl_cluster",
               "--filters-dir", str(filters), "--brokers", str(tmp_path / "brokers.cluster.yaml"),
               "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir", str(kafka_cfg.state_dir),
               "--trigger", "1s", "--stop-when-idle", "180", "--set", f"monitoring.port={metrics_port}",
               "--set", "monitoring.lag_interval_s=1", "--starting-offsets", "earliest"]
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    log = tmp_path / "cluster-job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    samples, deadline = {}, time.monotonic() + 300
    try:
        while time.monotonic() < deadline and job.poll() is None:
            try:
                samples = _scrape(url)
            except OSError:
                samples = {}
            if sum(_series(samples, "skyfilter_input_alerts_total", lane="delivery").values()) >= produced and \
                    sum(_series(samples, "skyfilter_archived_alerts_total").values()) >= produced - BAD:
                break
            time.sleep(1)
        assert job.poll() is None, f"the cluster job ended early: {log.read_text()[-2000:]}"
        time.sleep(2)  # a lag refresh between batches
        samples = _scrape(url)
        screen = "\n".join(status_screen(kafka_cfg, "cl_cluster"))
    finally:
        # What an operator does: `kill` the pid `skyfilter status` shows (the Python driver; spark-submit's
        # JVM launcher would die with 143 instead of stopping the query cleanly).
        status = json.loads((kafka_cfg.run_dir / "filter_stream.cl_cluster.json").read_text())
        os.kill(status["pid"], signal.SIGTERM)
        code = job.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]

    # The endpoint, scraped while the job ran, against what was produced and what the local run found.
    def total(name, **labels):
        return sum(_series(samples, name, stream="cl_cluster", **labels).values())

    assert total("skyfilter_input_alerts_total", lane="delivery") == produced
    assert total("skyfilter_input_alerts_total", lane="archive") == produced
    assert total("skyfilter_dead_letters_total") == BAD
    assert total("skyfilter_archived_alerts_total") == produced - BAD
    for name, count in local.matches_by_filter.items():
        assert total("skyfilter_filter_matches_total", filter=name) == count, name
    for broker, count in local.matches_by_broker.items():
        assert total("skyfilter_broker_messages_total", broker=broker) == count, broker
    for lane in ("delivery", "archive"):
        lag = _series(samples, "skyfilter_kafka_consumer_lag", stream="cl_cluster", lane=lane)
        assert len(lag) == kafka_cfg.topics.alerts_partitions and set(lag.values()) == {0.0}, lane
    assert total("skyfilter_quarantined_filters") == 0
    assert total("skyfilter_batch_duration_seconds") > 0 and total("skyfilter_processed_rows_per_second") > 0
    # every delivery's latency, from the delivery log as it was written: one observation per broker message
    assert total("skyfilter_delivery_latency_seconds_count", lane="delivery") == sum(local.matches_by_broker.values())
    assert 0 < total("skyfilter_batch_latency_seconds", lane="delivery", statistic="p50") <= total(
        "skyfilter_batch_latency_seconds", lane="delivery", statistic="max")
    assert f"stream 'cl_cluster': RUNNING (pid {status['pid']}" in screen and standalone.master_url in screen, screen
    assert screen.count("Kafka lag 0 alerts") == 2 and f"{produced:,} alerts in" in screen, screen
    assert "  delivery  last batch" in screen and "  archive   last batch" in screen, screen

    # The job ran on the workers: the master lists it as a finished application that used executors.
    apps = [a for a in standalone.state()["completedapps"] if a["name"] == "skyfilter-filter-stream-cl_cluster"]
    assert apps and apps[0]["cores"] >= 1, standalone.state()

    # Identical outputs: archive (each alert's message, cutouts included), matches and every broker topic.
    delta = kafka_cfg.delta_dir
    archived = [_table(spark, delta / name / "alerts") for name in ("cl_local", "cl_cluster")]
    assert archived[0] == archived[1] and len(archived[0]) == produced - BAD
    matches = ["alert_id", "broker", "filters", "format", "kafka_partition", "kafka_offset"]
    assert sorted(tuple(r) for r in spark.read.format("delta").load(str(delta / "cl_local" / "matches"))
                  .select(matches).collect()) == \
        sorted(tuple(r) for r in spark.read.format("delta").load(str(delta / "cl_cluster" / "matches"))
               .select(matches).collect())
    for broker in local_topics:
        mine, theirs = (sorted((m.key, m.value, m.headers["filters"]) for m in read_topic(kafka_cfg, topics[broker]))
                        for topics in (local_topics, cluster_topics))
        assert mine == theirs and len(mine) == local.matches_by_broker[broker], broker

    # The Delta metrics table holds the same figures the endpoint served.
    rows = spark.read.format("delta").load(str(delta / "cl_cluster" / "metrics")).where("lane = 'delivery'") \
        .orderBy("batch_id").collect()
    assert sum(r.input_alerts for r in rows) == produced and sum(r.rejected for r in rows) == BAD
    for name, count in local.matches_by_filter.items():
        assert sum(r.matches_by_filter.get(name, 0) for r in rows) == count
    assert set(rows[-1].kafka_lag.values()) == {0} and rows[-1].quarantined_filters == []
    assert all(r.processed_rows_per_second > 0 for r in rows)
