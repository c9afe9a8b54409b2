"""A real Prometheus scrapes a stream started as operators start it, while alerts flow; then the job is killed.

One ``spark-submit --trigger realtime`` job runs both delivery lanes: Real-time Mode for the SQL
brokers and micro-batches for the Python ones (``stream.realtime.python_filters:
false``), under a new ``--name`` on a topic that already holds alerts, with the
default 5-minute checkpoint interval.  While alerts flow, PromQL must see the
latency histograms, the counters and the lag move within seconds in both lanes
(no checkpoint passes: only what is heard as it happens can move them); every
expression of the Grafana dashboard must evaluate; the stream's consumer group
must hold its read positions; ``skyfilter status`` must show latency and lag.
After a kill -9, the "stream down" rule must fire.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import yaml
from prometheus_local import LocalPrometheus
from test_operations import group_offsets

from conftest import ROOT, port_base, stream_process
from skyfilter.kafka.lag import LatestOffsets
from skyfilter.local.processes import free_port
from skyfilter.local.status import status_screen
from skyfilter.producers.command import ProduceOptions, produce

TOPIC, NAME = "ops.alerts", "ops_night"
SQL_BROKERS, PYTHON_BROKERS = ("red_reliable", "summaries"), ("transients", "galactic")


@pytest.mark.slow
def test_prometheus_sees_both_lanes_move_while_alerts_flow_and_the_down_rule_fires(kafka_cfg, tmp_path):
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=40, interval_s=0.0, stamps=False,
                                      progress=False, first_visit=1))  # a topic holding alerts already
    folder = tmp_path / "stream"
    (folder / "filters").mkdir(parents=True)
    for path in (ROOT / "filters").iterdir():
        (folder / "filters" / path.name).write_text(path.read_text())
    brokers = yaml.safe_load((ROOT / "conf" / "brokers.yaml").read_text())
    for name, broker in brokers["brokers"].items():
        broker["topic"] = f"ops.{name}"
    (folder / "brokers.yaml").write_text(yaml.safe_dump(brokers))
    port, archive_port = free_port(port_base(19464)), free_port(port_base(19564))
    job, lines = stream_process(kafka_cfg, TOPIC, folder, [
        "--name", NAME, "--trigger", "realtime", "--set", "stream.realtime.python_filters=false",
        "--set", f"monitoring.port={port}", "--set", f"monitoring.archive_port={archive_port}"], submit=True)
    prometheus = LocalPrometheus(tmp_path / "prometheus", {"skyfilter-stream": [f"127.0.0.1:{port}"],
                                                           "skyfilter-archive": [f"127.0.0.1:{archive_port}"]})
    flowing = threading.Thread(target=produce, args=(kafka_cfg, ProduceOptions(
        topic=TOPIC, visits=4, alerts_per_visit=60, interval_s=2.0, stamps=False, progress=False, first_visit=2)),
        daemon=True)
    try:
        assert any("split" in line or "realtime" in line for line in lines), "\n".join(lines)
        flowing.start()
        stream = f'stream="{NAME}"'
        # Within seconds, in both lanes: latency observed per broker, alerts read, matches counted.
        for lane, names in (("realtime", SQL_BROKERS), ("delivery", PYTHON_BROKERS)):
            seen = prometheus.wait_for(
                f'count(increase(skyfilter_delivery_latency_seconds_count{{{stream}, lane="{lane}"}}[20s]) > 0)',
                lambda n: n >= 1, 60)
            assert seen, f"no delivery latency observed in the {lane} lane: " + "\n".join(lines[-30:])
            brokers_seen = {s["metric"]["broker"] for s in prometheus.query(
                f'skyfilter_delivery_latency_seconds_count{{{stream}, lane="{lane}"}} > 0')}
            assert brokers_seen and brokers_seen <= set(names), (lane, brokers_seen)
        assert prometheus.value(f'increase(skyfilter_input_alerts_total{{{stream}, lane="realtime"}}[15s])') > 0, \
            "alerts read in Real-time Mode are counted as they are read, not at the 5-minute checkpoint"
        assert prometheus.value(f'sum(increase(skyfilter_filter_matches_total{{{stream}}}[30s]))') > 0
        assert prometheus.wait_for(f'count(skyfilter_kafka_consumer_lag_seconds{{{stream}, lane="realtime"}})',
                                   lambda n: n == kafka_cfg.topics.alerts_partitions, 15) == \
            kafka_cfg.topics.alerts_partitions, "measured every monitoring.lag_interval_s (5 s)"
        p99 = prometheus.value(f'histogram_quantile(0.99, sum by (le) (rate(skyfilter_delivery_latency_seconds_bucket'
                               f'{{{stream}, lane="realtime"}}[1m])))')
        assert p99 is not None and 0 < p99 <= 60, p99
        assert prometheus.value(f"time() - max(skyfilter_heartbeat_timestamp_seconds{{{stream}}})") < 10
        # The archive process serves its own endpoint: its archived count moves as it archives.
        archived = prometheus.wait_for(f'sum(skyfilter_archived_alerts_total{{{stream}, job="skyfilter-archive"}})',
                                       lambda n: n > 0, 60)
        assert archived, ([(u["metric"]["job"], u["value"][1]) for u in prometheus.query('up')],
                          [line for line in lines if "metric" in line or "port" in line])
        assert prometheus.value('up{job="skyfilter-archive"}') == 1

        # Every panel of the dashboard evaluates against the running Prometheus.
        dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "skyfilter.json").read_text())
        empty = [panel["title"] for panel in dashboard["panels"]  # each query is valid PromQL, or query() raises
                 if not [prometheus.query(target["expr"].replace("$stream", NAME)) for target in panel["targets"]
                         if prometheus.query(target["expr"].replace("$stream", NAME))]]
        assert set(empty) <= {"Quarantined filters by name", "Kafka unreachable (seconds per minute)",
                              "Query restarts (1 h)", "Dead letters (10 min)"}, empty

        flowing.join(timeout=120)
        produced = 40 + 4 * 60
        # Once the flow stops: every alert read, nothing left to read in alerts and seconds, within a lag refresh.
        read = prometheus.wait_for(f'sum(skyfilter_input_alerts_total{{{stream}, lane="realtime"}})',
                                   lambda v: v >= produced - 40, 30)
        assert read == produced - 40, "a new name starts at the topic's end: the 40 alerts before it are not read"
        time.sleep(kafka_cfg.monitoring.lag_interval_s + 2)  # a lag measured after the last alert was read
        assert prometheus.value(f'sum(skyfilter_kafka_consumer_lag{{{stream}, lane=~"realtime|delivery"}})') == 0
        assert prometheus.value(f'max(skyfilter_kafka_consumer_lag_seconds{{{stream}, lane="realtime"}})') == 0
        # The stream's consumer group holds its read positions (informational: kafka_exporter, Burrow).
        latest = LatestOffsets(kafka_cfg)
        try:
            ends = latest(TOPIC)
        finally:
            latest.close()
        assert group_offsets(kafka_cfg, f"skyfilter.{NAME}", TOPIC, sorted(ends)) == ends, "\n".join(lines[-15:])

        time.sleep(2)  # the status file is rewritten every half second
        screen = "\n".join(status_screen(kafka_cfg, NAME))
        assert "latency   last minute, input to broker topic: " in screen, screen
        assert "realtime  " in screen and "measured by the job" in screen and "oldest unread 0.0 s old" in screen, \
            screen

        # kill -9: the endpoint is gone, and "stream down" fires after its 30 s.
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        killed = time.monotonic()
        firing = prometheus.wait_for('count(ALERTS{alertname="SkyfilterStreamDown", alertstate="firing", '
                                     'job="skyfilter-stream"})', lambda n: n >= 1, 90)
        assert firing == 1, prometheus.log_text()
        assert 30 <= time.monotonic() - killed + 2 <= 90
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        prometheus.stop()
