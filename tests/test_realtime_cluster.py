"""Real-time Mode on a Spark standalone cluster: every broker of the mix on the executors, none in micro-batches.

The job is started as an operator starts it on a cluster (``spark-submit --master
spark://...``) with SQL filters, a Python filter, a per-visit cap and a
watchlist subscription.  The Python filter and the watchlist run in filter
workers that each executor starts beside itself; the capped broker's matches
are admitted by the driver's visit cap ledger, which the executors ask over
TCP.  Mid-night one executor's filter worker is killed with ``kill -9``: it is
started again and the alerts it held are evaluated again.  Later a whole worker
is killed (worker, executor, filter workers): Spark runs the lost tasks again
elsewhere; repeats are bounded (alerts sent before the loss, once each) and
the cap holds.  Every broker topic
must equal an independent evaluation of the produced alerts (the watchlist's by
brute force), the capped one exactly its cap per visit.  The executors' read
marks reach the driver as they move: its metrics show every alert read, with no
lag, seconds after the last delivery (not at the 30 s checkpoint).  A second run
names a Python the executors do not have: the Python filter and the watchlist
subscription are quarantined, and the SQL broker delivers everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_realtime import LITE_SQL, PREDICATES
from test_watchlists import expected_list, positions, watch_command, watchlist_rows, write_list

from conftest import (
    NEGATIVE_PY,
    ROOT,
    check_topic,
    decode_messages,
    expected_deliveries,
    port_base,
    stream_folder,
)
from skyfilter.kafka.read_back import read_topic
from skyfilter.local.processes import free_port
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import rubin_schema

TOPIC = "rtc.alerts"
NIGHT, SEED, VISITS, PER_VISIT = "2026-11-24", 21, 6, 30  # test_watchlists' simulated night: known positions
BROKERS = """
max_alerts_per_visit: null
brokers:
  rtc_full:
    filters: [bright]
  rtc_lite:
    filters: [snr10]
    format: lite
  rtc_capped:
    filters: [bright]
    max_alerts_per_visit: 3
  rtc_python:
    filters: [negative]
    format: nocutouts
  rtc_watch:
    watchlists: [rtc_agn]
    format: nocutouts
"""
WORKER_MODULE = "skyfilter.filtering.filter_workers"


def executor_workers() -> dict[int, int]:
    """Filter worker pid -> its parent's pid, for the workers whose parent is an executor JVM."""
    found = {}
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        if WORKER_MODULE in " ".join(process.info["cmdline"] or []):
            try:
                parent = " ".join(psutil.Process(process.info["ppid"]).cmdline())
            except psutil.Error:
                continue
            if "CoarseGrainedExecutorBackend" in parent:
                found[process.info["pid"]] = process.info["ppid"]
    return found



def submit(cfg, cluster, folder, topic: str, name: str, cwd, *spark_conf: str, metrics_port: int | None = None,
           idle_s: int = 20) -> tuple[subprocess.Popen, list[str]]:
    """``spark-submit --master spark://...`` of the stream (delivery lane, Real-time Mode) as an operator starts
    it on a cluster, once it says ``running:``; its lines keep coming into the returned list.  ``idle_s``: the
    idle stop (a lost worker's tasks run again elsewhere within it)."""
    command = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", cluster.master_url,
               *spark_conf, str(ROOT / "pipelines" / "filter_stream.py"), "--topic", topic, "--name", name,
               "--filters-dir", str(folder / "filters"), "--brokers", str(folder / "brokers.yaml"),
               "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir), "--trigger", "realtime",
               "--lane", "delivery", "--stop-when-idle", str(idle_s),
               "--set", "stream.realtime.checkpoint_interval=30s",
               "--set", f"monitoring.port={metrics_port or 'null'}", "--set", "monitoring.lag_interval_s=1",
               "--set", "topics.alerts_partitions=3"]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                           env={**os.environ, "PYTHONUNBUFFERED": "1",
                                "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in job.stdout), daemon=True).start()
    deadline = time.monotonic() + 300
    while not any("running: " in line for line in lines):
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            (cwd / f"{name}.log").write_text("\n".join(lines))
            raise AssertionError("\n".join(line for line in lines if not line.lstrip().startswith("at "))[-3000:])
        time.sleep(0.5)
    return job, lines


def read_and_lag(url: str, wanted: int, deadline: float) -> tuple[float, float]:
    """The Real-time lane's alerts read and its lag (summed over partitions) on the job's metrics, once it has
    read ``wanted`` alerts with no lag (or at ``deadline``, ``time.monotonic()``)."""
    read = lag = -1.0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                families = list(text_string_to_metric_families(response.read().decode()))
        except OSError:
            families = []
        samples = [(s.name, s.labels, s.value) for family in families for s in family.samples]
        read = sum(v for n, labels, v in samples if n == "skyfilter_input_alerts_total"
                   and labels.get("lane") == "realtime")
        lag = sum(v for n, labels, v in samples if n == "skyfilter_kafka_consumer_lag"
                  and labels.get("lane") == "realtime")
        if read >= wanted and lag == 0:
            break
        time.sleep(0.5)
    return read, lag


@pytest.mark.slow
def test_every_broker_runs_in_realtime_mode_on_the_executors_of_a_cluster(kafka_cfg, spark, tmp_path,
                                                                          spark_standalone):
    folder = stream_folder(tmp_path / "stream", {"bright.sql": "diaSource.snr > 20", "snr10.sql": LITE_SQL,
                                                 "negative.py": NEGATIVE_PY}, BROKERS)
    alerts = {}
    for visit in range(VISITS):
        alerts |= positions(visit, PER_VISIT)
    listed_rows = watchlist_rows({i: alerts[i] for i in sorted(alerts)[::6]}, "agn")
    write_list(folder / "agn.csv", listed_rows)
    watch_command(kafka_cfg, "watchlist", "add", "rtc_agn", str(folder / "agn.csv"))
    open_registry(kafka_cfg).register(subject_for(TOPIC), rubin_schema("10.0"), same_alerts=True)

    cluster = spark_standalone  # 6 slots: the 3 partitions' long-lived tasks still fit once a worker is lost
    metrics_port = free_port(port_base(19474))
    job, lines = submit(kafka_cfg, cluster, folder, TOPIC, "rtc", tmp_path, metrics_port=metrics_port)
    try:
        produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=PER_VISIT, interval_s=3.0,
                                          stamps=True, seed=SEED, night=NIGHT, progress=False))
        deadline = time.monotonic() + 60
        while not (workers := executor_workers()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert workers, "no filter worker runs beside an executor:\n" + "\n".join(lines[-40:]) + "\n" + \
            "\n".join(" ".join(p.info["cmdline"] or [])[:300] for p in psutil.process_iter(["cmdline"])
                      if "filter_workers" in " ".join(p.info["cmdline"] or []))
        killed = next(iter(workers))
        os.kill(killed, signal.SIGKILL)  # one executor's worker, alone; the next alerts find it gone
        produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=PER_VISIT, interval_s=3.0,
                                          stamps=True, seed=SEED, night=NIGHT, progress=False, first_visit=3))
        after = executor_workers()
        sent = time.monotonic()
        before_loss = 4 * PER_VISIT
        read, lag = read_and_lag(f"http://127.0.0.1:{metrics_port}/metrics", before_loss, sent + 60)
        # from the last delivery (the tasks had read every alert by then) to the metrics showing it: the marks'
        # way to the driver, without the worker's restart and the alerts it evaluates again
        shown_after_s = time.time() - max(m.timestamp_ms for m in read_topic(kafka_cfg, "filtered.rtc_lite")) / 1000
        lost = kill_worker_with_a_filter_worker(cluster)  # a machine lost: worker, executor, filter workers
        produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=PER_VISIT, interval_s=3.0,
                                          stamps=True, seed=SEED, night=NIGHT, progress=False, first_visit=5))
        cluster.start()  # the machine comes back (the stream does not wait for it)
        assert job.wait(timeout=300) == 0, "\n".join(lines[-40:])
    finally:
        if job.poll() is None:
            job.kill()
        cluster.start()  # whatever happened, the session's cluster has both workers again
    text = "\n".join(lines)
    (tmp_path / "job.log").write_text(text)
    assert "5 of 5 broker(s) in Real-time Mode" in text and "micro-batches beside it" not in text, text[-3000:]
    assert killed not in after and set(after.values()) & set(workers.values()), \
        f"the killed worker's executor started another: before {workers}, after {after}"
    assert read >= before_loss and lag == 0 and shown_after_s < 10, \
        f"the executors' read marks reach the driver's metrics within seconds, not at a checkpoint 30 s apart: " \
        f"{read} read, lag {lag}, {shown_after_s:.1f} s after the last delivery"

    inputs = read_topic(kafka_cfg, TOPIC)
    records = {str(r["diaSourceId"]): r for r in decode_messages(inputs, rubin_schema("10.0"))}
    assert set(records) == set(alerts) and len(inputs) == VISITS * PER_VISIT
    by_id = {str(r["diaSourceId"]): m for r, m in zip(records.values(), inputs, strict=True)}
    expected = expected_deliveries(records, {name: [(f, PREDICATES[f])] for name, f in (
        ("rtc_full", "bright"), ("rtc_lite", "snr10"), ("rtc_python", "negative"))})
    assert expected["rtc_full"] and expected["rtc_python"]
    # Losing a machine replays what its tasks read since the last checkpoint: at-least-once, as Spark's Kafka
    # sink is.  A copy is bounded: only alerts sent before the loss, at most twice each.
    early = {alert_id for visit in range(4) for alert_id in positions(visit, PER_VISIT)}
    copies = {}
    for broker, full in (("rtc_full", True), ("rtc_lite", False), ("rtc_python", False)):
        delivered = read_topic(kafka_cfg, f"filtered.{broker}")
        copies[broker] = once_each(delivered, early)
        check_topic(copies[broker].pop("messages"), expected[broker], by_id, full=full)
    listed = expected_list(alerts, listed_rows)
    watched = read_topic(kafka_cfg, "filtered.rtc_watch")
    copies["rtc_watch"] = once_each(watched, early)
    assert listed and sorted(m.headers["alert_id"] for m in copies["rtc_watch"].pop("messages")) == \
        sorted(listed), "the watchlist subscription, against a brute-force search"
    capped = read_topic(kafka_cfg, "filtered.rtc_capped")
    copies["rtc_capped"] = once_each(capped, early)
    per_visit = Counter(records[m.headers["alert_id"]]["diaSource"]["visit"] for m in copies["rtc_capped"]
                        .pop("messages"))
    bright_per_visit = Counter(records[i]["diaSource"]["visit"] for i in expected["rtc_full"])
    assert per_visit == {visit: min(3, n) for visit, n in bright_per_visit.items()}, \
        ("the cap holds across the lost executor", per_visit, bright_per_visit)
    (tmp_path / "duplicates.txt").write_text(f"lost worker {lost}: {copies}\n")
    print(f"after losing worker {lost}: duplicate messages per broker {copies}")


def once_each(messages: list, early: set[str]) -> dict:
    """``messages`` with each alert's repeats removed (under ``messages``) and how many there were
    (``duplicates``); a repeat must be of an alert sent before the worker was lost, and at most one."""
    seen, kept, repeats = set(), [], Counter()
    for message in messages:
        alert_id = message.headers["alert_id"]
        if alert_id in seen:
            repeats[alert_id] += 1
        else:
            seen.add(alert_id)
            kept.append(message)
    assert set(repeats) <= early and all(n == 1 for n in repeats.values()), repeats
    return {"messages": kept, "duplicates": sum(repeats.values())}


def kill_worker_with_a_filter_worker(cluster) -> int:
    """``kill -9`` a standalone worker whose executor runs a filter worker, with every process under it;
    returns the worker's pid."""
    parents = set(executor_workers().values())
    for daemon in cluster.worker_daemons():
        pid = daemon.pid()
        if pid and {child.pid for child in psutil.Process(pid).children(recursive=True)} & parents:
            doomed = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            for process in doomed:
                process.kill()
            psutil.wait_procs(doomed, timeout=10)
            return pid
    raise AssertionError("no worker runs an executor with a filter worker")


@pytest.mark.slow
def test_an_executor_that_cannot_start_its_workers_quarantines_those_filters_and_the_rest_delivers(
        kafka_cfg, spark, tmp_path, spark_standalone):
    topic = "rtc-broken.alerts"
    folder = stream_folder(tmp_path / "stream", {"bright.sql": "diaSource.snr > 20", "negative.py": NEGATIVE_PY},
                           "brokers:\n  rtcb_sql:\n    filters: [bright]\n  rtcb_python:\n    filters: [negative]\n"
                           "  rtcb_watch:\n    watchlists: [rtcb_agn]\n")
    alerts = positions(0, PER_VISIT) | positions(1, PER_VISIT)
    write_list(folder / "agn.csv", watchlist_rows({i: alerts[i] for i in sorted(alerts)[::3]}, "agn"))
    watch_command(kafka_cfg, "watchlist", "add", "rtcb_agn", str(folder / "agn.csv"))
    open_registry(kafka_cfg).register(subject_for(topic), rubin_schema("10.0"), same_alerts=True)
    cluster = spark_standalone
    # the filter workers' Python is missing on the executors (Spark's own Python works)
    job, lines = submit(kafka_cfg, cluster, folder, topic, "rtcb", tmp_path,
                        "--conf", "spark.skyfilter.filterWorkerPython=/nonexistent/bin/python", idle_s=10)
    try:
        produce(kafka_cfg, ProduceOptions(topic=topic, visits=2, alerts_per_visit=PER_VISIT, interval_s=3.0,
                                          stamps=False, seed=SEED, night=NIGHT, progress=False))
        assert job.wait(timeout=300) == 0, "\n".join(lines[-40:])
    finally:
        if job.poll() is None:
            job.kill()
    (tmp_path / "rtcb.log").write_text("\n".join(lines))
    for name in ("negative", "watchlist:rtcb_agn"):  # the Python filter's worker, and the watch worker
        said = [line for line in lines if f"filter '{name}' quarantined" in line]
        assert len(said) == 1 and "executor" in said[0] and "did not start" in said[0], "\n".join(lines[-40:])
    records = {str(r["diaSourceId"]): r for r in decode_messages(read_topic(kafka_cfg, topic), rubin_schema("10.0"))}
    bright = {i for i, r in records.items() if PREDICATES["bright"](r)}
    assert bright and sorted(m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.rtcb_sql")) == \
        sorted(bright), "the SQL broker delivers everything"
    assert read_topic(kafka_cfg, "filtered.rtcb_python") == [], "no verdict, no message: nothing sent unfiltered"
    assert read_topic(kafka_cfg, "filtered.rtcb_watch") == [], "no crossmatch, no verdict, no message"
