"""`skyfilter demo` (what `make demo` runs): a small simulated night, end to end, then a summary.

Starts a fresh local Kafka under ``<project>/.local/demo``, starts
``spark-submit pipelines/filter_stream.py --trigger auto`` (the fastest delivery its brokers allow),
produces a few visits of Rubin alerts with cutouts on a cadence (serialized before the first
visit, so the simulated telescope's work stays out of the stream's latency), lets the
stream drain, reads every broker topic back to measure the end-to-end
latency (input append time -> output append time), and stops what it started.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from skyfilter.core.avro_schemas import rubin_schema
from skyfilter.core.brokers import load_brokers
from skyfilter.core.config import Config
from skyfilter.core.delivery import percentile, read_topic
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.kafka_local import LocalKafka
from skyfilter.core.memory import RssSampler, own_rss_mb
from skyfilter.core.processes import wait_for_exit
from skyfilter.core.registry import open_registry, subject_for
from skyfilter.core.spark_cluster import spark_home
from skyfilter.producers.command import ProduceOptions, produce

# What pipelines/filter_stream.py runs, wherever skyfilter is installed (found without importing Spark here).
STREAM_SCRIPT = Path(importlib.util.find_spec("skyfilter.jobs.filter_stream").origin)


def spark_submit_env() -> dict[str, str]:
    """The environment of an activated venv: spark-submit finds pyspark through python3 on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_HOME"] = str(spark_home())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _echo_stdout(process: subprocess.Popen, lines: list[str]) -> None:
    for line in process.stdout:
        lines.append(line.rstrip())
        print(f"  [stream] {line.rstrip()}", flush=True)


def run_demo(cfg: Config, args: argparse.Namespace) -> int:
    """Run the demo; returns the exit code."""
    cfg = cfg.copy()
    demo_dir = cfg.root / ".local" / "demo"
    cfg.set("state_dir", str(demo_dir))
    LocalKafka(cfg).stop()  # a demo interrupted earlier may have left its Kafka running
    shutil.rmtree(demo_dir, ignore_errors=True)
    demo_dir.mkdir(parents=True)
    kafka = LocalKafka(cfg)
    stream = None
    began = time.time()
    try:
        print(f"1/4 starting Kafka (KRaft) under {demo_dir}/kafka ...", flush=True)
        bootstrap = kafka.start()
        cfg.set("kafka.bootstrap_servers", bootstrap)
        print(f"    bootstrap servers {bootstrap}")

        print("2/4 starting the stream: spark-submit pipelines/filter_stream.py --trigger "
              f"{args.trigger} (Spark start-up takes ~20 s) ...", flush=True)
        log_path = demo_dir / "filter_stream.log"
        spark_submit = Path(sys.executable).parent / "spark-submit"
        command = [str(spark_submit), str(STREAM_SCRIPT), "--state-dir", str(demo_dir), "--bootstrap", bootstrap,
                   "--trigger", str(args.trigger), "--stop-when-idle", "12", "--wait-for-schema", "600"]
        if args.config:
            command += ["--config", args.config]
        with open(log_path, "w") as stderr:
            stream = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                      cwd=cfg.root, start_new_session=True, env=spark_submit_env())
        stream_lines: list[str] = []
        threading.Thread(target=_echo_stdout, args=(stream, stream_lines), daemon=True).start()
        _wait_for_line(stream, stream_lines, log_path, "waiting for a producer")
        schema = rubin_schema(cfg.simulation.schema_version)
        open_registry(cfg).register(subject_for(cfg.topics.alerts), schema, same_alerts=True)
        _wait_for_line(stream, stream_lines, log_path, "running: ")

        # The simulated telescope serializes every visit before the first is sent, as the benchmarks' cached
        # visits do: at a telescope the alerts are made on its own machines, not on the stream's two cores.
        print(f"3/4 producing {args.visits} visits x {args.alerts_per_visit} alerts with cutouts, "
              f"one visit every {args.interval_s:g} s (serialized first, then sent on the cadence) ...", flush=True)
        memory = RssSampler({"stream": lambda: stream.pid, "Kafka": lambda: kafka.nodes[0].pid()}, interval_s=1.0)
        with memory:
            report = produce(cfg, ProduceOptions(visits=args.visits, alerts_per_visit=args.alerts_per_visit,
                                                 interval_s=args.interval_s, stamps=True, progress=False,
                                                 ahead=True),
                             log=lambda line: print(f"    {line}", flush=True))
            print(f"    {report.summary()}")

            print("4/4 waiting for the stream to drain ...", flush=True)
            if stream.wait(timeout=1800) != 0:
                raise SkyfilterError(f"the stream job failed (exit {stream.returncode}); see {log_path}")
        time.sleep(0.5)  # let the stdout thread print the job's own summary
        _print_summary(cfg, bootstrap, report.alerts, stream_lines, time.time() - began)
        print(f"peak memory (RSS): stream job {memory.peak('stream'):,.0f} MB, Kafka {memory.peak('Kafka'):,.0f} MB, "
              f"both at once {memory.peak_total():,.0f} MB (and this producer {own_rss_mb():,.0f} MB)")
        print(f"    at the peak: {memory.peak_breakdown()}")
        return 0
    finally:
        if stream is not None and stream.poll() is None:
            stream.terminate()
            if not wait_for_exit(stream.pid, 30):
                stream.kill()
        if not args.keep:
            stopped = kafka.stop()
            print(f"stopped Kafka ({len(stopped)} node(s)); demo state kept in {demo_dir}")
        else:
            print(f"Kafka left running at {cfg.bootstrap_servers} (`skyfilter kafka stop --state-dir {demo_dir}`)")


def _wait_for_line(stream: subprocess.Popen, lines: list[str], log_path: Path, text: str,
                   timeout: float = 300) -> None:
    """Block until the stream job prints a line containing ``text``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if stream.poll() is not None:
            raise SkyfilterError(f"the stream job exited during start-up (exit {stream.returncode}); see {log_path}")
        if any(text in line for line in lines):
            return
        time.sleep(0.5)
    raise SkyfilterError(f"the stream job did not start within {timeout:.0f} s; see {log_path}")


def _print_summary(cfg: Config, bootstrap: str, produced: int, stream_lines: list[str], elapsed: float) -> None:
    brokers = load_brokers(cfg.path("stream.brokers"))
    print("\n=== demo summary ===")
    print(f"alerts produced:        {produced}")
    for line in stream_lines:
        if line.startswith(("1 batch", "  filter ", "  broker ")) or " batch(es): " in line:
            print(f"stream: {line.strip()}")
    latencies = []
    for broker in brokers:
        messages = read_topic(cfg, broker.topic)
        latencies += [m.latency_ms for m in messages if m.latency_ms is not None]
        print(f"topic {broker.topic:<28} {len(messages):>5} alerts ({broker.format})")
    if latencies:
        print(f"latency, input append -> output append: p50 {percentile(latencies, 0.5) / 1000:.2f} s, "
              f"p99 {percentile(latencies, 0.99) / 1000:.2f} s over {len(latencies)} delivered alerts")
    tables = cfg.delta_dir / cfg.topics.alerts
    print(f"Delta tables: {', '.join(sorted(p.name for p in tables.iterdir()))} under {tables}")
    print(f"demo finished in {elapsed:.0f} s")
    (cfg.state_dir / "demo-summary.json").write_text(json.dumps(
        {"produced": produced, "latencies_ms": latencies, "stream": stream_lines}, indent=1))
