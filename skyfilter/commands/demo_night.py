"""`skyfilter demo` (what `make demo` runs): a small simulated night, end to end, checked, then a summary.

Starts a fresh local Kafka under ``<project>/.local/demo``, starts
``spark-submit pipelines/filter_stream.py --trigger auto`` (the fastest delivery its brokers allow),
produces a few visits of Rubin alerts with cutouts on a cadence (serialized before the first
visit, so the simulated telescope's work stays out of the stream's latency), lets the
stream drain, then checks itself: the archive holds every produced alert once, and every
broker topic holds what its filters and cap select (``skyfilter/jobs/delivery_check.py``).
It reads every broker topic back for the end-to-end latency (input append time -> output
append time) and stops what it started.  Any shortfall is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.log import console_prefix
from skyfilter.kafka.read_back import percentile
from skyfilter.local.kafka import LocalKafka
from skyfilter.local.memory import RssSampler, own_rss_mb
from skyfilter.local.processes import wait_for_group
from skyfilter.local.spark_cluster import spark_home
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import rubin_schema

# What pipelines/filter_stream.py runs, wherever skyfilter is installed (found without importing Spark here).
STREAM_SCRIPT = Path(importlib.util.find_spec("skyfilter.jobs.filter_stream").origin)
DEMO_MARK = ".skyfilter-demo"  # in a folder the demo made, and may empty again
IDLE_STOP_S = 12  # the stream stops this long after the last alert it read (at least)
# The simulated night's pointings: with seed 5 the second visit lies on the Galactic plane (b = 3.8 deg), so
# the `galactic` broker has alerts to deliver too (seed 0's three visits are all 17-27 deg off the plane).
DEMO_SEED = 5
LATENCY_OBJECTIVE_MS = 1000.0  # the demo's standing target: p99 within 1 s
ALERT_MB = 0.14  # a simulated Rubin alert with its three cutouts
DISK_MARGIN_MB = 1024  # Spark's checkpoints, logs and scratch, Kafka's indexes


def spark_submit_env() -> dict[str, str]:
    """The environment of an activated venv: spark-submit finds pyspark through python3 on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_HOME"] = str(spark_home())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def idle_stop_s(interval_s: float) -> float:
    """How long the stream waits without alerts before it stops: longer than the gap between two visits."""
    return max(IDLE_STOP_S, interval_s + 4)


def disk_needed_mb(alerts: int) -> float:
    """Free space the demo needs: each alert in the input topic and the archive, plus a margin."""
    return 2.5 * alerts * ALERT_MB + DISK_MARGIN_MB


def check_disk(folder: Path, needed_mb: float) -> None:
    """Raise the one-line error when the disk under ``folder`` has less than ``needed_mb`` free."""
    free_mb = shutil.disk_usage(_existing(folder)).free / 2**20
    if free_mb < needed_mb:
        raise SkyfilterError(f"not enough free disk space under {folder}: {free_mb:,.0f} MB free, the demo needs "
                             f"about {needed_mb:,.0f} MB (free some space, or run fewer --visits / "
                             f"--alerts-per-visit)")


@contextmanager
def demo_lock(folder: Path) -> Iterator[None]:
    """Hold the demo folder's lock for the whole run: a second demo of the same folder stops at once."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f"{folder.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise SkyfilterError(f"another `skyfilter demo` is running on {folder} (pid {holder}): wait for it to "
                                 f"finish, or stop it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def fresh_folder(folder: Path, default: bool) -> None:
    """Empty ``folder`` for a new demo; a folder given with --state-dir only when the demo made it."""
    if not default and folder.exists() and any(folder.iterdir()) and not (folder / DEMO_MARK).exists():
        raise SkyfilterError(f"{folder} holds files the demo did not make: give another --state-dir")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / DEMO_MARK).write_text("made by `skyfilter demo`: emptied by the next demo\n")


def run_demo(cfg: Config, args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code (1 when the check finds anything missing)."""
    demo_dir = Path(args.state_dir).absolute() if args.state_dir else cfg.root / ".local" / "demo"
    cfg = cfg.with_values({"state_dir": str(demo_dir)})
    with demo_lock(demo_dir):
        try:
            return _run(cfg, args, demo_dir)
        except SkyfilterError as exc:
            if shutil.disk_usage(_existing(demo_dir)).free < 200 * 2**20:
                raise SkyfilterError(f"the disk under {demo_dir} is full ({exc})") from None
            raise


def _run(cfg: Config, args: argparse.Namespace, demo_dir: Path) -> int:
    cfg = cfg.with_values({"producer.log_level": 0})  # the demo watches Kafka itself (_watched): no retry lines
    produced_alerts = args.visits * args.alerts_per_visit
    check_disk(demo_dir, disk_needed_mb(produced_alerts))
    LocalKafka(cfg).stop()  # a demo interrupted earlier may have left its Kafka running
    fresh_folder(demo_dir, default=not args.state_dir)
    kafka = LocalKafka(cfg)
    stream = None
    began = time.time()
    try:
        print(f"1/5 starting Kafka (KRaft) under {demo_dir}/kafka ...", flush=True)
        bootstrap = kafka.start()
        cfg = cfg.with_values({"kafka.bootstrap_servers": bootstrap})
        print(f"    bootstrap servers {bootstrap}")

        print("2/5 starting the stream: spark-submit pipelines/filter_stream.py --trigger "
              f"{args.trigger} (Spark start-up takes ~30 s) ...", flush=True)
        log_path = demo_dir / "filter_stream.log"
        stream, stream_lines = _start_stream(cfg, args, demo_dir, bootstrap, log_path)
        _wait_for_line(stream, stream_lines, log_path, "waiting for a producer")
        schema = rubin_schema(cfg.simulation.schema_version)
        open_registry(cfg).register(subject_for(cfg.topics.alerts), schema, same_alerts=True)
        _wait_for_line(stream, stream_lines, log_path, "running: ")

        # The simulated telescope serializes every visit before the first is sent, as the benchmarks' cached
        # visits do: at a telescope the alerts are made on its own machines, not on the stream's two cores.
        print(f"3/5 producing {args.visits} visits x {args.alerts_per_visit} alerts with cutouts, "
              f"one visit every {args.interval_s:g} s (serialized first, then sent on the cadence) ...", flush=True)
        memory = RssSampler({"stream": lambda: stream.pid, "Kafka": lambda: kafka.nodes[0].pid()}, interval_s=1.0)
        with memory:
            options = ProduceOptions(visits=args.visits, alerts_per_visit=args.alerts_per_visit,
                                     interval_s=args.interval_s, stamps=True, progress=False, ahead=True,
                                     seed=DEMO_SEED)
            with console_prefix("    "):
                report = _watched(lambda: produce(cfg, options), kafka, stream, log_path)
            print(f"    {report.summary()}")

            print(f"4/5 waiting for the stream to drain (it stops {idle_stop_s(args.interval_s):g} s after the last "
                  f"alert) ...", flush=True)
            _watched(stream.wait, kafka, stream, log_path, stream_ends=True)
            if stream.returncode != 0:
                raise SkyfilterError(f"the stream job failed (exit {stream.returncode}); see {log_path}")
        time.sleep(0.5)  # let the stdout thread print the job's own summary
        print("5/5 checking every broker topic against the filters, re-run in batch over the archive ...",
              flush=True)
        problems = _check_and_summarize(cfg, report.alerts, stream_lines, began)
        print(f"peak memory (RSS): stream job {memory.peak('stream'):,.0f} MB, Kafka {memory.peak('Kafka'):,.0f} MB, "
              f"both at once {memory.peak_total():,.0f} MB (and this producer {own_rss_mb():,.0f} MB)")
        print(f"    at the peak: {memory.peak_breakdown()}")
        if problems:
            print(f"demo check failed: {problems[0]}" + (f" (and {len(problems) - 1} more problem(s) above)"
                                                         if len(problems) > 1 else ""))
            return 1
        return 0
    finally:
        _stop_stream(stream)
        if not args.keep:
            stopped = kafka.stop()
            print(f"stopped Kafka ({len(stopped)} node(s)); demo state kept in {demo_dir}")
        else:
            print(f"Kafka left running at {cfg.bootstrap_servers} (`skyfilter kafka stop --state-dir {demo_dir}`)")


def _start_stream(cfg: Config, args: argparse.Namespace, demo_dir: Path, bootstrap: str,
                  log_path: Path) -> tuple[subprocess.Popen, list[str]]:
    """``spark-submit pipelines/filter_stream.py`` as an operator starts it, in a process group of its own; its
    output lines are echoed and collected."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    command = [str(spark_submit), str(STREAM_SCRIPT), "--state-dir", str(demo_dir), "--bootstrap", bootstrap,
               "--trigger", str(args.trigger), "--stop-when-idle", str(idle_stop_s(args.interval_s)),
               "--wait-for-schema", "600"]
    if args.config:
        command += ["--config", args.config]
    for setting in args.set:
        command += ["--set", setting]
    with open(log_path, "w") as stderr:
        stream = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  cwd=cfg.root, start_new_session=True, env=spark_submit_env())
    lines: list[str] = []

    def echo() -> None:
        for line in stream.stdout:
            lines.append(line.rstrip())
            print(f"  [stream] {line.rstrip()}", flush=True)

    threading.Thread(target=echo, daemon=True).start()
    return stream, lines


def _watched(work, kafka: LocalKafka, stream: subprocess.Popen, log_path: Path, stream_ends: bool = False):
    """``work()``'s result, while Kafka and the stream job are watched: either stopping is one error at once
    (the producer would otherwise retry for minutes, and the stream wait out an outage)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
        failure = kafka.failure()
        if failure is not None:
            raise SkyfilterError(failure)
        if not stream_ends and stream.poll() is not None:
            raise SkyfilterError(f"the stream job exited during the night (exit {stream.returncode}); see {log_path}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _stop_stream(stream: subprocess.Popen | None) -> None:
    """Stop the stream job and everything it started (its archive process, Python workers): SIGTERM to
    spark-submit (a clean stop, as `kill` does), then SIGKILL to its process group after 30 s."""
    if stream is None:
        return
    group = stream.pid  # start_new_session: its own group
    if stream.poll() is None:
        stream.send_signal(signal.SIGTERM)
    if wait_for_group(group, 30):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_for_group(group, 10)
    stream.wait()


def _wait_for_line(stream: subprocess.Popen, lines: list[str], log_path: Path, text: str,
                   timeout: float = 300) -> None:
    """Block until the stream job prints a line containing ``text``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if stream.poll() is not None:
            last = next((line for line in reversed(lines) if line.strip()), "")
            raise SkyfilterError(f"the stream job exited during start-up (exit {stream.returncode})"
                                 + (f": {last.strip()}" if last else "") + f"; see {log_path}")
        if any(text in line for line in lines):
            return
        time.sleep(0.5)
    raise SkyfilterError(f"the stream job did not start within {timeout:.0f} s; see {log_path}")


def _check_and_summarize(cfg: Config, produced: int, stream_lines: list[str], began: float) -> list[str]:
    """Check the archive and every broker topic, print the summary; returns the problems (none: all is well)."""
    from skyfilter.jobs.delivery_check import check_delivery
    from skyfilter.spark.session import get_spark

    spark = get_spark("skyfilter-demo-check", conf={"spark.ui.enabled": "false"})
    try:
        with console_prefix("    "):
            check = check_delivery(spark, cfg, cfg.topics.alerts, cfg.topics.alerts, cfg.path("stream.filters_dir"),
                                   cfg.path("stream.brokers"))
    finally:
        spark.stop()
    problems = check.problems()
    if check.input_messages != produced:
        problems.insert(0, f"the input topic holds {check.input_messages} message(s), {produced} were produced")
    print("\n=== demo summary ===")
    print(f"alerts produced: {produced}; archived: {check.archived_rows} row(s), {check.archived_alerts} distinct "
          f"alert(s), night(s) {', '.join(check.nights)}")
    latencies = [latency for broker in check.brokers for latency in broker.latencies_ms]
    for broker in check.brokers:
        cap = "no cap" if broker.cap is None else f"cap {broker.cap} per visit"
        verdict = "ok" if not broker.problems() else "MISSING OR EXTRA ALERTS"
        print(f"broker {broker.broker:<13} {broker.topic:<24} {broker.delivered:>5} alerts, expected "
              f"{broker.expected:>5} ({broker.matched} matches, {cap}): {verdict}")
    if latencies:
        p99 = percentile(latencies, 0.99)
        print(f"latency, input append -> output append: p50 {percentile(latencies, 0.5) / 1000:.2f} s, "
              f"p99 {p99 / 1000:.2f} s over {len(latencies)} delivered alerts (objective p99 <= "
              f"{LATENCY_OBJECTIVE_MS / 1000:g} s: {'met' if p99 <= LATENCY_OBJECTIVE_MS else 'missed'})")
    else:
        problems.append("no broker topic received any alert: no latency to report")
    for line in problems:
        print(f"problem: {line}")
    tables = cfg.delta_dir / cfg.topics.alerts
    print(f"Delta tables: {', '.join(sorted(p.name for p in tables.iterdir()))} under {tables}")
    print(f"demo finished in {time.time() - began:.0f} s: "
          + ("every broker holds what its filters and caps select" if not problems else
             f"{len(problems)} problem(s)"))
    (cfg.state_dir / "demo-summary.json").write_text(json.dumps(
        {"produced": produced, "latencies_ms": latencies, "problems": problems, "stream": stream_lines,
         "brokers": {b.broker: {"delivered": b.delivered, "expected": b.expected, "matched": b.matched}
                     for b in check.brokers}}, indent=1))
    return problems


def _existing(folder: Path) -> Path:
    """``folder`` or its nearest existing parent (what disk it is on)."""
    while not folder.exists():
        folder = folder.parent
    return folder
