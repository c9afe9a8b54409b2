"""Filter scaling: the stream's throughput with 1, 10, 100, 250 filters in its one query, SQL and Python.

    python -m bench.filter_scaling [--alerts 4000] [--filters 1,10,100,250] [--kinds sql,python]

Produces one simulated night once, then runs ``pipelines/filter_stream.py``
(``--available-now``, one SparkSession) over the same topic once per filter
count, each with a fresh checkpoint and archive.  Filter ``i`` is a generated
threshold condition; filters are spread over up to ``--brokers`` brokers
(format full, the default cap of 20 alerts per visit); every run has the same
brokers, so only the number of filters changes.  Throughput comes
from the stream's own Delta metrics table:

* stream: alerts / (end of the last batch - start of the first), delivery
  and archive included;
* filter + deliver: alerts / the summed time from batch start to the Kafka
  write's acknowledgement (where the number of filters can matter).

Writes ``filter_scaling.{json,csv,md,png}`` into ``--results``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.filter_sets import write_filter_set
from bench.harness import add_common_arguments, add_warm_up_flag, runs_table, settings_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.filter_scaling",
        description="Throughput of the stream job against the number of filters it evaluates in one query.")
    parser.add_argument("--alerts", type=int, default=4000, help="alerts to produce (default 4000)")
    parser.add_argument("--alerts-per-visit", type=int, default=1000, help="visit size (default 1000)")
    parser.add_argument("--filters", default="1,10,100,250", help="filter counts to compare (default 1,10,100,250)")
    parser.add_argument("--kinds", default="sql,python", help="filter languages, each measured separately "
                                                              "(default sql,python)")
    parser.add_argument("--brokers", type=int, default=20, help="most brokers the filters are spread over (20)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per filter count; the best counts (2)")
    parser.add_argument("--max-offsets", type=int, default=1000, help="maxOffsetsPerTrigger (default 1000)")
    add_warm_up_flag(parser, "the first language and filter count once")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def measure(totals) -> dict:
    """Throughput figures of a delivery-lane run, from the totals the stream job returns."""
    wall = totals.delivery_finished - totals.delivery_started
    return {"alerts": totals.input_alerts, "batches": totals.batches, "seconds": wall,
            "alerts_per_s": totals.input_alerts / wall, "deliver_alerts_per_s": totals.input_alerts /
            totals.delivery_busy_s}


def measure_archive(spark, metrics_path: Path) -> dict:
    """Throughput figures of an archive-lane run, from its rows of the Delta metrics table."""
    from pyspark.sql import functions as F

    row = spark.read.format("delta").load(str(metrics_path)).where(F.col("lane") == "archive").agg(
        F.sum("input_alerts").alias("alerts"), F.count(F.lit(1)).alias("batches"),
        F.min("started_at").alias("first"), F.max("finished_at").alias("last")).first()
    wall = (row["last"] - row["first"]).total_seconds()
    return {"alerts": row["alerts"], "batches": row["batches"], "seconds": wall, "alerts_per_s": row["alerts"] / wall}


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.harness import bench_kafka, driver_and_kafka
    from bench.report import write_results
    from skyfilter.jobs.filter_stream import parse_args as stream_args
    from skyfilter.jobs.filter_stream import run as run_stream
    from skyfilter.producers.command import ProduceOptions, produce
    from skyfilter.spark.session import get_spark

    counts = sorted({int(c) for c in args.filters.split(",")})
    kinds = [k.strip() for k in args.kinds.split(",")]
    run_id = time.strftime("%Y%m%d%H%M%S")
    topic = f"bench.scaling.{run_id}"
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        visits = max(1, args.alerts // args.alerts_per_visit)
        report = produce(cfg, ProduceOptions(topic=topic, visits=visits, alerts_per_visit=args.alerts_per_visit,
                                             interval_s=0.0, stamps=args.stamps, seed=3, progress=not args.quiet))
        spark = get_spark("skyfilter-bench-filter-scaling")
        with driver_and_kafka(spark, cluster) as memory:
            results: dict[tuple[str, int], list[dict]] = {(kind, count): [] for kind in kinds for count in counts}
            runs = [(repeat, kind, count) for repeat in range(args.repeats) for kind in kinds for count in counts]
            if args.warm_up:
                runs.insert(0, ("warm-up", kinds[0], counts[0]))
            bar = tqdm(runs, desc="stream runs", unit="run", disable=args.quiet)
            for repeat, kind, count in bar:
                bar.set_postfix(kind=kind, filters=count)
                folder = args.state_dir / "filter_sets" / f"{kind}_{count}"
                filters, brokers = write_filter_set(folder, count, kind, args.brokers)
                name = f"scaling_{run_id}_{kind}_{count}_{repeat}"
                argv = ["--topic", topic, "--name", name, "--filters-dir", str(filters), "--brokers", str(brokers),
                        "--available-now", "--lane", "delivery", "--bootstrap", cfg.bootstrap_servers,
                        "--state-dir", str(args.state_dir),
                        "--set", f"stream.max_offsets_per_trigger={args.max_offsets}"]
                totals = run_stream(stream_args(argv), spark)
                if repeat != "warm-up":
                    results[(kind, count)].append(measure(totals))
        rows = [row for kind in kinds for row in _rows(results, kind, counts, args)]
    notes = [f"{report.alerts} simulated Rubin alerts ({'with' if args.stamps else 'without'} cutouts), "
             f"{visits} visit(s); maxOffsetsPerTrigger {args.max_offsets}; best of {args.repeats} run(s) per count"
             + (f"; one unmeasured run ({kinds[0]}, {counts[0]} filters) first warmed the driver." if args.warm_up
                else "; no warm-up run: the first row pays for a cold driver."),
             "delivery lane: alerts / (end of its last batch - start of its first): decode, filters, caps, Kafka "
             "delivery (the archive lane, which does not depend on the filters, is not run).",
             "filter + deliver: alerts / summed time from batch start to the Kafka write's acknowledgement."]
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        for row in mine[1:]:
            notes.append(f"{kind.upper()}, {row['filters']} filters: {row['ratio']:.2f}x the delivery throughput of "
                         f"{mine[0]['filters']} ({row['deliver_ratio']:.2f}x for filter + deliver); target >= 0.7x "
                         f"at 100.")
    columns = [("kind", "language"), ("filters", "filters"), ("brokers", "brokers"), ("alerts", "alerts"),
               ("batches", "batches"), ("seconds", "delivery s"), ("alerts_per_s", "delivery alerts/s"),
               ("ratio", "x 1 filter"), ("deliver_alerts_per_s", "filter+deliver alerts/s"),
               ("deliver_ratio", "x 1 filter")]
    return write_results(args.results, "filter_scaling", "Filter scaling: SQL and Python filters", rows, columns,
                         notes, settings_of(args), args.command, _plot(rows),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def _rows(results: dict[tuple[str, int], list[dict]], kind: str, counts: list[int],
          args: argparse.Namespace) -> list[dict]:
    rows = []
    for count in counts:
        best = max(results[(kind, count)], key=lambda r: r["alerts_per_s"])
        best_deliver = max(r["deliver_alerts_per_s"] for r in results[(kind, count)])
        rows.append({"kind": kind, "filters": count, "brokers": args.brokers, "alerts": best["alerts"],
                     "batches": best["batches"], "seconds": round(best["seconds"], 2),
                     "alerts_per_s": round(best["alerts_per_s"], 1), "deliver_alerts_per_s": round(best_deliver, 1)})
    for row in rows:
        row["ratio"] = round(row["alerts_per_s"] / rows[0]["alerts_per_s"], 3)
        row["deliver_ratio"] = round(row["deliver_alerts_per_s"] / rows[0]["deliver_alerts_per_s"], 3)
    return rows


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        counts = [r["filters"] for r in mine]
        line, = axis.plot(counts, [r["alerts_per_s"] for r in mine], "o-", label=f"{kind.upper()}: stream")
        axis.plot(counts, [r["deliver_alerts_per_s"] for r in mine], "s--", color=line.get_color(),
                  label=f"{kind.upper()}: filter + deliver")
        axis.plot(counts, [0.7 * mine[0]["alerts_per_s"]] * len(mine), ":", color=line.get_color(),
                  label=f"{kind.upper()}: 0.7 x 1 filter")
    axis.set_xscale("log")
    axis.set_xlabel("filters in the query")
    axis.set_ylabel("alerts / s")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize="small")
    axis.set_title("Throughput against the number of filters")
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.filter_scaling", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
