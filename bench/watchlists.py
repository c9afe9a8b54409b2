"""Watchlists at Rubin's rate: the trigger sweep's stream with and without a large watchlist filter.

    python -m bench.watchlists [--sizes 0,1000000,10000000] [--trigger 0] [--visits 3]
                               [--alerts-per-visit 10000] [--visit-seconds 39]

Each run sends the same cached visits at Rubin's cadence through a fresh stream
(both lanes) with the broker-like filter set of ``bench/trigger_sweep.py``;
a run with N > 0 sources adds one broker subscribed to a watchlist of N
sources (random over the sky, 2 arcsec, plus one beside every 100th alert so
that matches happen).  Reported per run:

* delivery latency p50/p95/p99/max over every delivered match (as the sweep);
* the watchlist broker's match rate (matched alerts / alerts sent);
* the peak memory of the driver's process tree (JVM and Python workers);
* the cost of matching alone, in this process: loading the list (s, MB) and
  matching a 10,000-alert visit's positions (µs per alert).

Target: p99 with 1,000,000 sources within 1.2x of the run without a list.
Writes ``watchlists.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench.filter_sets import add_load_arguments
from bench.harness import add_common_arguments, add_stream_arguments, add_warm_up_flag, runs_table, settings_of

LIST_NAME = "bench_sources"
TARGET_RATIO = 1.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.watchlists",
        description="Delivery latency, memory and matching cost of a stream with a 0 to 10,000,000-source "
                    "watchlist, at Rubin's cadence.")
    parser.add_argument("--sizes", default="0,1000000,10000000",
                        help="watchlist sizes, comma-separated; 0 = the stream without one, the runs' mean p99 the "
                             "baseline (default 0,1000000,10000000)")
    parser.add_argument("--trigger", default="0", help="the delivery trigger: realtime or seconds (default 0)")
    parser.add_argument("--visits", type=int, default=3, help="visits per run (default 3)")
    parser.add_argument("--alerts-per-visit", type=int, default=10000, help="alerts per visit (default 10000)")
    parser.add_argument("--visit-seconds", type=float, default=39.0, help="seconds between visits (default 39)")
    parser.add_argument("--filters", type=int, default=100, help="generated filters (default 100)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers the filters are spread over (default 20)")
    parser.add_argument("--format", default="nocutouts", choices=["full", "nocutouts", "lite"],
                        help="the generated brokers' format with --load uniform (default nocutouts)")
    parser.add_argument("--cap", default="none", help="alerts per visit and broker, or none (default none)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    add_stream_arguments(parser)
    add_load_arguments(parser)
    add_warm_up_flag(parser, "one visit of an earlier night through each stream")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def sample_positions(cached: Path, schema: dict, every: int = 100) -> np.ndarray:
    """(ra, dec) of every ``every``-th cached alert."""
    import fastavro

    from bench.alert_cache import LENGTH

    parsed = fastavro.parse_schema(schema)
    found = []
    with cached.open("rb") as handle:
        visits, per_visit = LENGTH.unpack(handle.read(LENGTH.size))
        for position in range(visits * per_visit):
            key_size, body_size = LENGTH.unpack(handle.read(LENGTH.size))
            handle.seek(key_size, 1)
            body = handle.read(body_size)
            if position % every == 0:
                source = fastavro.schemaless_reader(io.BytesIO(body), parsed, None)["diaSource"]
                found.append((source["ra"], source["dec"]))
    return np.array(found)


def make_sources(size: int, near: np.ndarray, seed: int = 3):
    """``size`` sources: one within 1 arcsec of each position of ``near``, the rest random over the sky."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    random = size - len(near)
    ra = np.concatenate([(near[:, 0] + 0.5 / 3600) % 360, rng.uniform(0, 360, random)])
    dec = np.concatenate([near[:, 1], np.degrees(np.arcsin(rng.uniform(-1, 1, random)))])
    ids = np.char.add("s", np.arange(size).astype(str))
    return pd.DataFrame({"source_id": ids, "source_name": None, "ra": ra, "dec": dec, "radius_arcsec": 2.0})


def matching_cost(stored, positions: np.ndarray) -> dict:
    """Loading a list version and matching a visit of positions with it, in this process."""
    import psutil

    from skyfilter.watch.crossmatch import watch_outputs

    version = stored.for_workers()
    before = psutil.Process().memory_info().rss
    began = time.perf_counter()
    watch_outputs((version,), positions[:1, 0], positions[:1, 1])
    loaded_s = time.perf_counter() - began
    memory_mb = (psutil.Process().memory_info().rss - before) / 1e6
    began = time.perf_counter()
    watch_outputs((version,), positions[:, 0], positions[:, 1])
    per_alert_us = (time.perf_counter() - began) / len(positions) * 1e6
    return {"load_s": round(loaded_s, 2), "list_memory_mb": round(memory_mb), "match_us_per_alert":
            round(per_alert_us, 1)}


def with_watch_broker(filters: Path, brokers: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of a filter set with one more broker, subscribed to the benchmark's watchlist."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(filters, folder / "filters")
    text = brokers.read_text().rstrip() + f"\n  watchers:\n    watchlists: [{LIST_NAME}]\n    format: lite\n" \
                                          f"    max_alerts_per_visit: null\n"
    (folder / "brokers.yaml").write_text(text)
    return folder / "filters", folder / "brokers.yaml"


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.alert_cache import cached_visits
    from bench.filter_sets import cap_value, load_filter_set, load_label
    from bench.harness import bench_kafka, bench_schema, bench_spark, driver_and_kafka, kafka_pid
    from bench.report import write_results
    from bench.trigger_sweep import sweep_one
    from skyfilter.watch.store import store

    sizes = [int(s) for s in args.sizes.split(",")]
    run_id = time.strftime("%Y%m%d%H%M%S")
    rows = []
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, args.visits, args.alerts_per_visit, args.stamps,
                               progress=not args.quiet)
        near = sample_positions(cached, schema)
        visit = sample_positions(cached, schema, every=max(1, args.visits))[: args.alerts_per_visit]
        spark = bench_spark(cfg, "skyfilter-bench-watchlists", args.trigger, cfg.topics.alerts_partitions)
        base = load_filter_set(args, args.state_dir / "filter_sets" / f"watch_{args.filters}", args.format,
                               cap_value(args.cap))
        overall = driver_and_kafka(spark, cluster).__enter__()
        for position, size in enumerate(sizes, start=1):
            cost, filter_set = {}, base
            if size:
                began = time.time()
                stored = store(spark, cfg, "watchlist", LIST_NAME, make_sources(size, near), {"bench": size})
                cost = {"stored_s": round(time.time() - began, 1), **matching_cost(stored, visit)}
                filter_set = with_watch_broker(*base, args.state_dir / "filter_sets" / f"watch_{size}")
            with driver_and_kafka(spark, cluster) as memory:
                row = sweep_one(cfg, spark, args, cached, schema, args.trigger, f"{run_id}_{position}",
                                kafka_pid(cluster), filter_set=filter_set)  # each run its own topic and tables
            matched = 0
            if size:
                name = f"sweep_{run_id}_{position}_{row['trigger'].replace('.', '_')}"
                matched = spark.read.format("delta").load(str(args.state_dir / "delta" / name / "matches")) \
                    .where("broker = 'watchers'").select("alert_id").distinct().count()
            rows.append({"sources": size, "p50_s": row["p50_s"], "p95_s": row["p95_s"], "p99_s": row["p99_s"],
                         "max_s": row["max_s"], "alerts": row["alerts"],
                         "match_rate": round(matched / row["alerts"], 4),
                         "driver_peak_mb": round(memory.peak("driver")), **cost})
            print(f"{size:,} sources: p99 {row['p99_s']} s, match rate {rows[-1]['match_rate']}, "
                  f"driver tree peak {rows[-1]['driver_peak_mb']:,} MB {cost}", flush=True)
        overall.__exit__(None, None, None)
    without = [r["p99_s"] for r in rows if r["sources"] == 0 and r["p99_s"]]  # several: their mean
    baseline = sum(without) / len(without) if without else None
    for row in rows:
        row["p99_vs_none"] = round(row["p99_s"] / baseline, 2) if baseline and row["p99_s"] else None
    columns = [("sources", "sources"), ("p50_s", "p50 (s)"), ("p99_s", "p99 (s)"), ("p99_vs_none", "p99 / no list"),
               ("max_s", "max (s)"), ("match_rate", "match rate"), ("driver_peak_mb", "driver tree peak (MB)"),
               ("load_s", "list load (s)"), ("list_memory_mb", "list in memory (MB)"),
               ("match_us_per_alert", "matching (µs/alert)")]
    notes = [f"{args.visits} visits of {args.alerts_per_visit:,} alerts every {args.visit_seconds:g} s, trigger "
             f"{args.trigger}, {load_label(args, args.format, args.cap)}; a run with sources adds a broker "
             f"subscribed to the list (lite). Target: p99 with 1,000,000 sources <= {TARGET_RATIO}x the run "
             f"without. Matching cost measured in the benchmark's own process."]

    return write_results(args.results, "watchlists", "Watchlists at Rubin's rate", rows, columns, notes,
                         settings_of(args), args.command, _plot(rows), overall.peaks(), runs_table(args),
                         overall.peak_breakdown())


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['sources']:,}" for r in rows]
    ax.bar(labels, [r["p99_s"] or 0 for r in rows], label="p99")
    ax.bar(labels, [r["p50_s"] or 0 for r in rows], label="p50")
    ax.set_xlabel("watchlist sources")
    ax.set_ylabel("delivery latency (s)")
    ax.set_title("Delivery latency with a watchlist broker")
    ax.legend()
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.watchlists", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
