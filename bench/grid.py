"""DMTN-028's scaling grid, small scale: producers x partitions x stamps, producing and consuming time per visit.

    python -m bench.grid [--producers 1,4,16] [--partitions 1,4,8] [--alerts-per-visit 10000] [--visits 3]

For every cell, ``--visits`` visits are sent, each into a fresh topic with
the cell's partitions, by the cell's producer processes (pre-serialized
alerts, ``bench/alert_cache.py``); then plain consumer processes (one per
partition, at most ``--consumers``) read and decode the visit with fastavro.
Per cell, as DMTN-028's tables: producing time (first send to the last
acknowledgement) and consuming time (consumers started to the last alert
decoded), mean +- standard deviation and min-max over the visits.

Then, for the fastest cell with stamps, the producer settings as a second
axis (linger, batch size, compression), as the Kafka load-testing guides do.
Writes ``grid.{json,csv,md,png}``; topics are deleted after each visit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.harness import add_common_arguments, runs_table, settings_of

PRODUCER_VARIANTS = {
    "project settings": {},
    "linger 0 ms": {"linger.ms": 0},
    "linger 100 ms": {"linger.ms": 100},
    "batch 1 MB": {"batch.size": 1048576},
    "lz4": {"compression.type": "lz4"},
    "zstd": {"compression.type": "zstd"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grid",
        description="DMTN-028 grid: producing and consuming time per visit against producers, partitions, stamps.")
    parser.add_argument("--producers", default="1,4,16", help="producer process counts (default 1,4,16)")
    parser.add_argument("--partitions", default="1,4,8", help="topic partition counts (default 1,4,8)")
    parser.add_argument("--stamp-modes", default="on,off", help="cutouts on, off or both (default on,off)")
    parser.add_argument("--alerts-per-visit", type=int, default=10000, help="alerts per visit (default 10000)")
    parser.add_argument("--visits", type=int, default=3, help="visits per cell (default 3)")
    parser.add_argument("--consumers", type=int, default=2, help="most consumer processes (default 2: cores)")
    parser.add_argument("--producer-variants", action=argparse.BooleanOptionalAction, default=True,
                        help="also compare producer settings on the fastest cell with stamps (default yes)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def measure_cell(cfg, args, cached: Path, schema: dict, producers: int, partitions: int, label: str,
                 producer_settings: dict | None = None) -> dict:
    """Produce and consume ``--visits`` visits with one grid cell's settings; DMTN-028's figures."""
    from bench.alert_cache import CachedSource
    from bench.consumers import run_consumers
    from skyfilter.kafka.topics import admin_client
    from skyfilter.producers.command import send_source

    produce_s, consume_s, megabytes = [], [], 0.0
    for _ in range(args.visits):
        topic = f"bench.grid.{time.time_ns()}"
        cfg = cfg.with_values({"topics.alerts_partitions": partitions})
        report = send_source(cfg, topic, CachedSource(cached, 1), schema, 0.0, producers, False,
                             producer_settings)
        if report.failures:
            raise RuntimeError(f"{report.failures} alerts not produced: {report.visits[0].first_error}")
        produce_s.append(report.visits[0].seconds)
        megabytes = report.bytes / 1e6
        jobs = [(list(range(partitions))[i::args.consumers], None) for i in range(min(partitions, args.consumers))]
        consume_s.append(run_consumers(cfg, topic, jobs, schema)["seconds"])
        admin = admin_client(cfg)
        admin.delete_topics([topic])[topic].result(30)
    return {"cell": label, "producers": producers, "partitions": partitions, "megabytes": round(megabytes),
            **_spread("produce", produce_s), **_spread("consume", consume_s)}


def _spread(name: str, values: list[float]) -> dict:
    return {f"{name}_mean_s": round(statistics.mean(values), 3),
            f"{name}_std_s": round(statistics.stdev(values), 3) if len(values) > 1 else 0.0,
            f"{name}_min_s": round(min(values), 3), f"{name}_max_s": round(max(values), 3)}


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from tqdm import tqdm

    from bench.alert_cache import cached_visits
    from bench.harness import bench_kafka, bench_schema, kafka_pid
    from bench.report import write_results
    from skyfilter.local.memory import RssSampler

    producer_counts = [int(v) for v in args.producers.split(",")]
    partition_counts = [int(v) for v in args.partitions.split(",")]
    modes = [m.strip() == "on" for m in args.stamp_modes.split(",")]
    rows = []
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cells = [(s, p, n) for s in modes for p in producer_counts for n in partition_counts]
        with RssSampler({"kafka": kafka_pid(cluster)}) as memory:
            for stamps, producers, partitions in tqdm(cells, desc="grid cells", disable=args.quiet):
                cached = cached_visits(args.state_dir / "cache", schema, 1, args.alerts_per_visit, stamps,
                                       progress=not args.quiet)
                row = measure_cell(cfg, args, cached, schema, producers, partitions, "grid")
                rows.append({"stamps": "on" if stamps else "off", **row, "settings": "project settings"})
            with_stamps = [r for r in rows if r["stamps"] == "on"]
            if args.producer_variants and with_stamps:
                best = min(with_stamps, key=lambda r: r["produce_mean_s"])
                cached = cached_visits(args.state_dir / "cache", schema, 1, args.alerts_per_visit, True, progress=False)
                for variant, settings in tqdm(list(PRODUCER_VARIANTS.items())[1:], desc="producer settings",
                                              disable=args.quiet):
                    row = measure_cell(cfg, args, cached, schema, best["producers"], best["partitions"],
                                       "producer settings", settings)
                    rows.append({"stamps": "on", **row, "settings": variant})
    for row in rows:
        row["alerts_per_s"] = round(args.alerts_per_visit / row["produce_mean_s"])
    columns = [("cell", "axis"), ("stamps", "stamps"), ("producers", "producers"), ("partitions", "partitions"),
               ("settings", "producer settings"), ("megabytes", "MB/visit"),
               ("produce_mean_s", "produce mean s"), ("produce_std_s", "+-"), ("produce_min_s", "min"),
               ("produce_max_s", "max"), ("alerts_per_s", "produce alerts/s"),
               ("consume_mean_s", "consume mean s"), ("consume_std_s", "+-"), ("consume_min_s", "min"),
               ("consume_max_s", "max")]
    notes = [f"{args.visits} visit(s) of {args.alerts_per_visit} simulated Rubin alerts per cell, each into a fresh "
             f"topic; producing = first send to last acknowledgement (pre-serialized alerts, acks=all); consuming = "
             f"start of the consumer processes (at most {args.consumers}, fastavro decoding) to the last alert read.",
             "DMTN-028 (13 AWS nodes): best distribution 14.55 s per 10,000-alert visit (3.75 s producing + 10.8 s "
             "consuming); this machine has 2 cores, shared by producers, Kafka and consumers."]
    return write_results(args.results, "grid", "DMTN-028 grid: producers x partitions x stamps", rows, columns,
                         notes, settings_of(args), args.command, _plot(rows),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    grid = [r for r in rows if r["cell"] == "grid"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, stamps in zip(axes, ("on", "off"), strict=True):
        for producers in sorted({r["producers"] for r in grid}):
            cells = [r for r in grid if r["stamps"] == stamps and r["producers"] == producers]
            if cells:
                axis.errorbar([r["partitions"] for r in cells], [r["produce_mean_s"] for r in cells],
                              yerr=[r["produce_std_s"] for r in cells], marker="o", capsize=3,
                              label=f"produce, {producers} producer(s)")
                axis.errorbar([r["partitions"] for r in cells], [r["consume_mean_s"] for r in cells],
                              yerr=[r["consume_std_s"] for r in cells], marker="s", linestyle="--", capsize=3,
                              label=f"consume, {producers} producer(s)")
        axis.set_title(f"stamps {stamps}")
        axis.set_xlabel("partitions")
        axis.set_ylim(bottom=0)
    axes[0].set_ylabel("seconds per visit")
    for axis in axes:
        if axis.lines:
            axis.legend(fontsize="x-small")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.grid", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
