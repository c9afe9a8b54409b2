"""Backpressure: a stream started after a whole night was produced catches up in bounded batches.

    python -m bench.catch_up [--visits 10] [--alerts-per-visit 1000] [--max-offsets 1000,2000,5000]

Produces the night first (no stream running), then starts
``pipelines/filter_stream.py --available-now`` once per ``maxOffsetsPerTrigger``
value (both lanes' bound), each run a separate process with its own checkpoints
and archive, over the same backlog and with the project's own filters and
brokers: the delivery lane catches up first, then the archive lane, whose
batches (cached while their tables are written) are what needs memory.  While it
runs, the resident memory of the stream's whole process tree (driver JVM,
Python driver and workers) and of the Kafka JVM is sampled every 0.5 s.

Reports per setting: archive batches, the largest, catch-up time (first
delivery batch start to last archive batch end) and rate, and peak memory.  The point: the batch size,
not the backlog, sets the memory a catch-up needs.  Writes
``catch_up.{json,csv,md,png}`` into ``--results``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.harness import ROOT, add_common_arguments, kafka_pid, runs_table, settings_of

BATCH_LINE = re.compile(r"^archive batch (\d+): (\d+) alerts archived, (\d+) rejected.* done in ([\d.]+) s")
DELIVERY_LINE = re.compile(r"^batch (\d+): (\d+) alerts.* delivered in ([\d.]+) s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.catch_up",
        description="Catch-up of a backlog (a whole night produced before the stream starts) in batches "
                    "bounded by maxOffsetsPerTrigger, with the memory it takes.")
    parser.add_argument("--visits", type=int, default=10, help="visits in the backlog (default 10)")
    parser.add_argument("--alerts-per-visit", type=int, default=1000, help="alerts per visit (default 1000)")
    parser.add_argument("--max-offsets", default="1000,2000,5000",
                        help="maxOffsetsPerTrigger values to compare, comma-separated (default 1000,2000,5000)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def catch_up(cfg, topic: str, name: str, max_offsets: int, state_dir: Path, kafka_pid, total: int,
             quiet: bool) -> dict:
    """One stream run over the backlog; its batches, timing and memory."""
    from skyfilter.local.memory import RssSampler

    command = [sys.executable, str(ROOT / "pipelines" / "filter_stream.py"), "--topic", topic, "--name", name,
               "--available-now", "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(state_dir),
               "--set", f"stream.max_offsets_per_trigger={max_offsets}",
               "--set", f"archive.max_offsets_per_trigger={max_offsets}"]
    began = time.time()
    log_path = state_dir / f"{name}.stderr.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    batches: list[dict] = []
    first_start = None
    progress = tqdm(total=total, unit="alert", desc=f"catch-up, maxOffsetsPerTrigger {max_offsets}", disable=quiet)
    with RssSampler({"stream": lambda: process.pid, "kafka": kafka_pid}) as memory:
        for line in process.stdout:
            delivered = DELIVERY_LINE.match(line.strip())
            if delivered and first_start is None:
                first_start = time.time() - began - float(delivered[3])
            match = BATCH_LINE.match(line.strip())
            if match:
                alerts = int(match[2]) + int(match[3])
                batches.append({"batch": int(match[1]), "alerts": alerts, "seconds": float(match[4]),
                                "finished": time.time() - began})
                progress.update(alerts)
        code = process.wait()
    progress.close()
    common = {"max_offsets": max_offsets, "stream_peak_mb": round(memory.peak("stream")),
              "kafka_peak_mb": round(memory.peak("kafka")),
              "timeline": [{"t": t, **reading} for t, reading in memory.samples], "batch_list": batches}
    if code != 0 or not batches:
        return {**common, "alerts": sum(b["alerts"] for b in batches), "batches": len(batches),
                "outcome": _failure(log_path, code)}
    first_start = first_start if first_start is not None else batches[0]["finished"] - batches[0]["seconds"]
    seconds = batches[-1]["finished"] - first_start
    alerts = sum(b["alerts"] for b in batches)
    return {**common, "alerts": alerts, "batches": len(batches), "largest_batch": max(b["alerts"] for b in batches),
            "catch_up_s": round(seconds, 1), "alerts_per_s": round(alerts / seconds, 1),
            "start_up_s": round(first_start, 1), "outcome": "caught up"}


def _failure(log_path: Path, code: int) -> str:
    """What stopped a stream run, in a few words, from its stderr."""
    text = log_path.read_text()
    if "OutOfMemoryError" in text:
        return "failed: Spark ran out of memory (java.lang.OutOfMemoryError)"
    last = [line for line in text.splitlines() if "error" in line.lower()][-1:] or [f"exit code {code}"]
    return f"failed: {last[0][:200]}"


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.harness import bench_kafka
    from bench.report import write_results
    from skyfilter.core.errors import SkyfilterError
    from skyfilter.producers.command import ProduceOptions, produce

    settings = sorted({int(v) for v in args.max_offsets.split(",")})
    run_id = time.strftime("%Y%m%d%H%M%S")
    topic = f"bench.catchup.{run_id}"
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        report = produce(cfg, ProduceOptions(topic=topic, visits=args.visits, alerts_per_visit=args.alerts_per_visit,
                                             interval_s=0.0, stamps=args.stamps, seed=11, progress=not args.quiet))
        runs = [catch_up(cfg, topic, f"catchup_{run_id}_{value}", value, args.state_dir, kafka_pid(cluster),
                         report.alerts, args.quiet) for value in settings]
    columns = [("max_offsets", "maxOffsetsPerTrigger"), ("alerts", "alerts"), ("batches", "batches"),
               ("largest_batch", "largest batch"), ("start_up_s", "start-up s"), ("catch_up_s", "catch-up s"),
               ("alerts_per_s", "alerts/s"), ("stream_peak_mb", "stream peak MB"), ("kafka_peak_mb", "Kafka peak MB"),
               ("outcome", "outcome")]
    rows = [{key: r.get(key) for key, _ in columns} for r in runs]
    if not any(r["outcome"] == "caught up" for r in rows):
        raise SkyfilterError(f"no setting caught up: {rows[0]['outcome']}")
    backlog_mb = report.bytes / 1e6
    notes = [f"Backlog: {report.alerts} simulated Rubin alerts ({'with' if args.stamps else 'without'} cutouts, "
             f"{backlog_mb:,.0f} MB) in {args.visits} visit(s), produced before the stream started.",
             "catch-up: start of the first batch to the end of the last (delivery and Delta archive included); "
             "start-up: process start (JVM, Spark session, plan) to the first batch.",
             "stream peak: highest resident memory of the stream's process tree (driver JVM, Python driver, "
             "Python workers); Kafka peak: the broker JVM" + ("" if args.bootstrap is None else
                                                            " (not measured: external Kafka)") + "."]
    return write_results(args.results, "catch_up", "Catching up a night's backlog in bounded batches", rows,
                         columns, notes, settings_of(args), args.command, _plot(runs),
                         {name: max(r[f"{name}_peak_mb"] for r in runs) for name in ("stream", "kafka")},
                         runs_table(args))


def _plot(runs: list[dict]):
    from bench.report import pyplot

    plt = pyplot()

    figure, (done, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        label = f"maxOffsetsPerTrigger {run['max_offsets']}" + ("" if run["outcome"] == "caught up" else " (failed)")
        times = [0.0] + [b["finished"] for b in run["batch_list"]]
        archived = [0]
        for batch in run["batch_list"]:
            archived.append(archived[-1] + batch["alerts"])
        done.step(times, archived, where="post", label=label)
        line, = memory.plot([s["t"] for s in run["timeline"]], [s["stream"] for s in run["timeline"]],
                            label=f"stream, {label}")
        if any(s["kafka"] for s in run["timeline"]):
            memory.plot([s["t"] for s in run["timeline"]], [s["kafka"] for s in run["timeline"]], ":",
                        color=line.get_color(), label=f"Kafka, {label}")
    done.set_xlabel("seconds since the stream process started")
    done.set_ylabel("alerts archived and delivered")
    done.set_title("Catch-up")
    done.legend()
    memory.set_xlabel("seconds since the stream process started")
    memory.set_ylabel("resident memory (MB)")
    memory.set_title("Memory")
    memory.set_ylim(bottom=0)
    memory.legend(fontsize="small")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.catch_up", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
