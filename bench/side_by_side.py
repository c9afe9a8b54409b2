"""Side by side, same topic, same machine: the consume limit, Spark's own read, the 2018 mini-broker design,
and skyfilter's two lanes.

    python -m bench.side_by_side [--alerts 2000] [--filters 100] [--consumers 2]

One topic of simulated Rubin alerts is produced once, then read by:

* raw: ``--consumers`` plain confluent-kafka processes splitting the
  partitions, no decoding (the limit), then the same with fastavro decoding;
* per-filter processes: the 2018 mini-broker design, one Python consumer
  process per filter, each reading and decoding every alert and applying its
  own filter (no output is written: this favours the baseline);
* Spark's bare read: one Spark job reading the topic with the stream's source
  options, and nothing else (best of ``--repeats``): what any Spark job pays;
* skyfilter's delivery lane: ``pipelines/filter_stream.py --lane delivery
  --available-now`` with the same filters as SQL, over 20 brokers;
* skyfilter's archive lane: ``--lane archive --available-now`` on the same
  topic (every alert, cutouts included, to Delta).

Each is reported as alerts/s (alerts / wall time; a lane's from its first batch
start to its last batch end, best of ``--repeats`` fresh streams, as the bare
read is best of as many jobs) and as ratios to the raw consume rate and to
Spark's bare read.  Writes ``side_by_side.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.harness import add_common_arguments, runs_table, settings_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.side_by_side",
        description="skyfilter against the raw consume rate and the one-process-per-filter design, same data.")
    parser.add_argument("--alerts", type=int, default=2000, help="alerts in the topic (default 2000)")
    parser.add_argument("--filters", type=int, default=100, help="filters (default 100)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers of the skyfilter run (default 20)")
    parser.add_argument("--consumers", type=int, default=2, help="processes of the raw consumers (default 2: cores)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of Spark's bare read and of each lane, a fresh stream each; the best counts, the "
                             "first is reported too (default 3)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.alert_cache import CachedSource, cached_visits
    from bench.consumers import run_consumers
    from bench.filter_scaling import measure, measure_archive
    from bench.filter_sets import write_filter_set
    from bench.harness import bench_kafka, bench_schema, driver_and_kafka
    from bench.report import write_results
    from skyfilter.jobs.filter_stream import parse_args as stream_args
    from skyfilter.jobs.filter_stream import run as run_stream
    from skyfilter.kafka.topics import topic_partitions
    from skyfilter.producers.command import send_source
    from skyfilter.spark.session import get_spark

    run_id = time.strftime("%Y%m%d%H%M%S")
    topic = f"bench.side.{run_id}"
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, 1, args.alerts, args.stamps, progress=not args.quiet)
        report = send_source(cfg, topic, CachedSource(cached), schema, 0.0, 2, not args.quiet)
        partitions = list(range(topic_partitions(cfg, topic)))
        split = [(partitions[i::args.consumers], None) for i in range(min(args.consumers, len(partitions)))]
        spark = get_spark("skyfilter-bench-side-by-side")
        with driver_and_kafka(spark, cluster) as memory:
            rows = [{"design": "raw consume (confluent-kafka)", **run_consumers(cfg, topic, split, None)},
                    {"design": "raw consume + fastavro decode", **run_consumers(cfg, topic, split, schema)},
                    {"design": f"one Python process per filter ({args.filters})",
                     **run_consumers(cfg, topic, [(partitions, i) for i in range(args.filters)], schema)}]
            rows.append({"design": "Spark's bare read of the topic (one job)", "processes": 1,
                         **spark_read(spark, cfg, topic, report.alerts, args.repeats)})
            filters, brokers = write_filter_set(args.state_dir / "filter_sets" / f"side_{args.filters}",
                                                args.filters, "sql", args.brokers)
            for lane, design in (("delivery", f"skyfilter delivery lane ({args.filters} SQL filters, "
                                              f"{args.brokers} brokers)"),
                                 ("archive", "skyfilter archive lane (Delta, cutouts included)")):
                seconds = []
                for attempt in range(args.repeats):  # a fresh stream each time (own name and checkpoints)
                    name = f"side_{run_id}_{attempt}"
                    totals = run_stream(stream_args(["--topic", topic, "--name", name, "--filters-dir", str(filters),
                                                     "--brokers", str(brokers), "--available-now", "--lane", lane,
                                                     "--bootstrap", cfg.bootstrap_servers,
                                                     "--state-dir", str(args.state_dir)]), spark)
                    figures = measure(totals) if lane == "delivery" else \
                        measure_archive(spark, args.state_dir / "delta" / name / "metrics")
                    seconds.append(figures["seconds"])
                rows.append({"design": design, "processes": 1, **best_of(figures["alerts"], seconds)})
    limit, bare = rows[0]["alerts_per_s"], rows[3]["alerts_per_s"]
    for row in rows:
        row["x_raw"] = round(row["alerts_per_s"] / limit, 3)
        row["x_spark"] = round(row["alerts_per_s"] / bare, 3)
    delivery, per_filter = rows[4], rows[2]["alerts_per_s"]
    notes = [f"{report.alerts} simulated Rubin alerts ({'with' if args.stamps else 'without'} cutouts, "
             f"{report.bytes / 1e6:,.0f} MB) in one topic of {len(partitions)} partitions.",
             "Raw consumers split the partitions; each per-filter process reads every alert. A lane's time is its "
             "first batch start to its last batch end (start-up excluded), best of "
             f"{args.repeats} fresh streams as Spark's bare read is best of {args.repeats} jobs; 'first run s' is "
             "the first of them (for a lane, its driver's first stream: code generation and JIT included). "
             "The delivery lane decodes without the "
             "cutouts, filters, applies the caps (20 per visit) and writes to Kafka; the archive lane then writes "
             "the same alerts to Delta. They are run one after the other here; in a stream they run side by side.",
             f"Targets: delivery lane >= 0.5x Spark's bare read: {delivery['x_spark']:.2f}x; its ratio to the raw "
             f"consume rate: {delivery['x_raw']:.2f}x; >= 5x the per-filter process design: "
             f"{delivery['alerts_per_s'] / per_filter:.1f}x."]
    columns = [("design", "design"), ("processes", "processes"), ("alerts", "alerts per process"),
               ("seconds", "wall s"), ("first_s", "first run s"), ("alerts_per_s", "alerts/s"),
               ("x_raw", "x raw consume"), ("x_spark", "x Spark's bare read")]
    return write_results(args.results, "side_by_side", "Side by side: the consume limit, per-filter processes, "
                         "skyfilter", rows, columns, notes, settings_of(args), args.command, _plot(rows),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def spark_read(spark, cfg, topic: str, alerts: int, repeats: int = 3) -> dict:
    """Spark reading the whole topic with the stream's source options and doing nothing else: best of ``repeats``."""
    from skyfilter.kafka.clients import spark_source_options

    times = []
    for _ in range(repeats):
        began = time.time()
        spark.read.format("kafka").options(**spark_source_options(cfg)).option("subscribe", topic).load() \
            .select("value").write.format("noop").mode("overwrite").save()
        times.append(time.time() - began)
    return best_of(alerts, times)


def best_of(alerts: int, seconds: list[float]) -> dict:
    """The figures of repeated runs over the same alerts: the fastest counts, the first is kept beside it."""
    best = min(seconds)
    return {"alerts": alerts, "seconds": round(best, 2), "first_s": round(seconds[0], 2),
            "alerts_per_s": round(alerts / best, 1)}


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.barh([r["design"] for r in rows][::-1], [r["alerts_per_s"] for r in rows][::-1], color="tab:blue")
    axis.set_xscale("log")
    axis.set_xlabel("alerts / s (log)")
    axis.set_title("Same topic, same machine")
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.side_by_side", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
