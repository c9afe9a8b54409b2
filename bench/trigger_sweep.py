"""Trigger sweep: the same visits, produced at Rubin's cadence, through the stream with each delivery trigger,
Real-time Mode included, and the archive lane running at the same time.

    python -m bench.trigger_sweep [--triggers realtime,0,1,5] [--visits 10] [--alerts-per-visit 1000]
                                  [--visit-seconds 3.9] [--load broker|uniform] [--format nocutouts] [--cap none]
                                  [--set KEY=VALUE]

Rubin sends 10,000 alerts per 39 s visit (256 alerts/s).  Time-scaled runs
keep that rate with smaller, faster visits (``--alerts-per-visit 1000
--visit-seconds 3.9``).  The visits are simulated once and cached, then sent on
schedule into a fresh topic for every trigger, with a fresh stream (both
lanes).  Every trigger serves the same brokers (uncapped by default, the only
kind Real-time Mode serves).  Per trigger, from the stream's own Delta tables:

* delivery latency of every delivered match, input append time to the append
  time of its delivery-log record, written with the broker message: p50/p95/p99/max;
* drain: last send to last delivery (short = delivery kept up);
* the archive lane's lag (alerts produced, not yet archived) at the end of each
  archive batch, its growth (least-squares slope while sending; flat = kept up)
  and its largest value.

Writes ``trigger_sweep.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.filter_sets import add_load_arguments
from bench.harness import add_common_arguments, add_stream_arguments, add_warm_up_flag, runs_table, settings_of

TARGETS_MS = {"realtime": 1000, "0": 5000}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trigger_sweep",
        description="Per-alert delivery latency and archive lag against the delivery trigger, at Rubin cadence.")
    parser.add_argument("--triggers", default="realtime,0,1,5",
                        help="delivery triggers: realtime, or seconds (default realtime,0,1,5)")
    parser.add_argument("--visits", type=int, default=3, help="visits per trigger (default 3)")
    parser.add_argument("--alerts-per-visit", type=int, default=10000, help="alerts per visit (default 10000)")
    parser.add_argument("--visit-seconds", type=float, default=39.0, help="seconds between visits (default 39)")
    parser.add_argument("--filters", type=int, default=100, help="generated filters (default 100)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers the filters are spread over (default 20)")
    parser.add_argument("--format", default="nocutouts", choices=["full", "nocutouts", "lite"],
                        help="the brokers' format (default nocutouts)")
    parser.add_argument("--cap", default="none", help="alerts per visit and broker, or none (default none)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    add_stream_arguments(parser, "a config setting of the streams, e.g. --set stream.realtime.checkpoint_interval=5m")
    add_load_arguments(parser)
    add_warm_up_flag(parser, "one visit of an earlier night through each stream (both lanes take it in)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def sweep_one(cfg, spark, args, cached: Path, schema: dict, trigger: str, run_id: str,
              kafka_node=lambda: None, filter_set: tuple[Path, Path] | None = None) -> dict:
    """The visits through a fresh stream with one delivery trigger; its latency, drain and archive lag.

    With ``--warm-up``, one visit of an earlier night goes through the same stream first and both lanes take
    it in before the measured visits start: what is measured is a stream as it runs all night (JIT-compiled
    code in both lanes' JVMs, tables open, first batches done), not its first minute.  ``filter_set``: (filters
    folder, brokers file) instead of the one ``args`` describe.
    """
    from bench.alert_cache import EARLIER_NIGHT, CachedSource, cached_visits
    from bench.cpu import cpu_now, cpu_used
    from bench.filter_sets import cap_value, load_filter_set
    from bench.lags import lag_growth, lag_timeline, lane_batches
    from bench.stream_runner import register_topic, start_stream
    from skyfilter.producers.command import send_source

    label = trigger if trigger == "realtime" else f"{trigger}s"
    topic, name = f"bench.sweep.{run_id}.{label}", f"sweep_{run_id}_{label.replace('.', '_')}"
    filters, brokers = filter_set or load_filter_set(args, args.state_dir / "filter_sets" / f"sweep_{args.filters}",
                                                     args.format, cap_value(args.cap))
    register_topic(cfg, topic, schema)
    stream = start_stream(cfg, spark, topic, name, filters, brokers, label, archive_trigger=args.archive_trigger,
                          log_trigger=args.log_trigger, sets=args.sets)
    try:
        warm = 0
        if args.warm_up:
            earlier = cached_visits(args.state_dir / "cache", schema, 1, args.alerts_per_visit, args.stamps,
                                    progress=False, night=EARLIER_NIGHT)
            warm = send_source(cfg, topic, CachedSource(earlier, 1), schema, 0.0, args.producers, progress=False).alerts
            stream.wait_for_alerts(warm, timeout_s=900)
        kafka = kafka_node()
        cpu_before, measured_from = cpu_now(os.getpid(), kafka), time.time()
        report = send_source(cfg, topic, CachedSource(cached, args.visits), schema, args.visit_seconds,
                             args.producers, progress=not args.quiet)
        stream.wait_for_alerts(report.alerts + warm, timeout_s=3600)
        cpu = cpu_used(cpu_before, cpu_now(os.getpid(), kafka)) | {"window": round(time.time() - measured_from, 1)}
    finally:
        stream.stop(spark)
    tables = args.state_dir / "delta" / name
    latency = spark.sql(f"""
        SELECT count(*) AS n, percentile(ms, 0.5) AS p50, percentile(ms, 0.95) AS p95,
               percentile(ms, 0.99) AS p99, max(ms) AS max, max(delivered_at) AS last
        FROM (SELECT unix_millis(delivered_at) - unix_millis(kafka_timestamp) AS ms, delivered_at
              FROM delta.`{tables / 'matches'}` WHERE night != '{EARLIER_NIGHT}')""").first()
    first_send = min(v.start for v in report.visits)
    last_send = max(v.finish for v in report.visits)
    lag = lag_timeline([(v.finish, v.alerts) for v in report.visits],
                       lane_batches(spark, tables / "metrics", ("archive",), since=measured_from), first_send)
    sending = last_send - first_send
    return {"trigger": label, "alerts": report.alerts,
            "offered_per_s": round(report.alerts / max(sending, args.visit_seconds * max(len(report.visits) - 1, 1)),
                                   1),
            "messages": latency["n"], "p50_s": _s(latency["p50"]), "p95_s": _s(latency["p95"]),
            "p99_s": _s(latency["p99"]), "max_s": _s(latency["max"]),
            "drain_s": round(latency["last"].timestamp() - last_send, 2) if latency["last"] else None,
            "archive_max_lag": max((p["lag"] for p in lag), default=0),
            "archive_lag_growth_per_s": round(lag_growth(lag, sending), 1),
            "cpu_driver_s": cpu["driver"], "cpu_archive_s": cpu["archive"], "cpu_kafka_s": cpu["kafka"],
            "cpu_other_s": cpu["other"], "cpu_window_s": cpu["window"],
            "archive_lag": lag}


def _s(millis) -> float | None:
    return None if millis is None else round(millis / 1000, 3)


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.alert_cache import cached_visits
    from bench.filter_sets import cap_value, load_label
    from bench.harness import bench_kafka, bench_schema, bench_spark, driver_and_kafka, kafka_pid
    from bench.report import write_results

    triggers = [t.strip() for t in args.triggers.split(",")]
    run_id = time.strftime("%Y%m%d%H%M%S")
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, args.visits, args.alerts_per_visit, args.stamps,
                               progress=not args.quiet)
        partitions = cfg.topics.alerts_partitions
        spark = bench_spark(cfg, "skyfilter-bench-trigger-sweep", triggers[0], partitions)
        rows = []
        with driver_and_kafka(spark, cluster) as memory:
            for trigger in triggers:
                spark = bench_spark(cfg, "skyfilter-bench-trigger-sweep", trigger, partitions)
                rows.append(sweep_one(cfg, spark, args, cached, schema, trigger, run_id, kafka_node=kafka_pid(cluster)))
    columns = [("trigger", "delivery trigger"), ("alerts", "alerts"), ("offered_per_s", "offered alerts/s"),
               ("messages", "matches delivered"), ("p50_s", "p50 s"), ("p95_s", "p95 s"), ("p99_s", "p99 s"),
               ("max_s", "max s"), ("drain_s", "drain s"), ("archive_max_lag", "archive max lag (alerts)"),
               ("archive_lag_growth_per_s", "archive lag growth alerts/s"), ("cpu_driver_s", "CPU s: delivery driver"),
               ("cpu_archive_s", "CPU s: archive"), ("cpu_kafka_s", "CPU s: Kafka"),
               ("cpu_other_s", "CPU s: producers, rest"), ("cpu_window_s", "over s")]
    rate = args.alerts_per_visit / args.visit_seconds
    notes = [f"{args.visits} visit(s) of {args.alerts_per_visit} simulated Rubin alerts "
             f"({'with' if args.stamps else 'without'} cutouts) every {args.visit_seconds:g} s ({rate:.0f} alerts/s; "
             f"Rubin: 256/s), {load_label(args, args.format, cap_value(args.cap))}, {args.producers} producer(s); "
             f"the archive lane ran beside delivery in every run.",
             "Latency: input Kafka append time to the append time of the match's delivery-log record, written by "
             "the same Kafka write as the broker message. drain: last send to last delivery.",
             "CPU: core-seconds from the start of sending until the archive took in the last alert (2 cores: at most "
             "2 core-seconds per second of the window), per part: the benchmark's Spark driver (the delivery "
             "lane, its Python workers), the archive lane's own process, Kafka, and the rest of the machine (the "
             "producer processes).",
             "Archive lag: alerts sent but not yet archived; growth is its least-squares slope over the second "
             "half of the sending window (about 0 = the archive kept up)."
             + (" Each stream first took in one unmeasured visit of an earlier night in both lanes (warm JVMs, "
                "as all night long); the CPU window and the latencies leave it out." if args.warm_up
                else " No warm-up: each stream's first minute (cold JVMs, first batches) is measured.")]
    for row in rows:
        key = "realtime" if row["trigger"] == "realtime" else row["trigger"].rstrip("s")
        if key in TARGETS_MS and row["p99_s"] is not None:
            target = TARGETS_MS[key] / 1000
            kept = row["archive_lag_growth_per_s"] <= 0.05 * rate
            growth = row["archive_lag_growth_per_s"]
            notes.append(f"Target at trigger {row['trigger']}: delivery p99 <= {target:g} s "
                         f"({'met' if row['p99_s'] <= target else 'missed'}: {row['p99_s']:.2f} s) with the archive "
                         f"lag not growing ({'met' if kept else 'missed'}: {growth} alerts/s).")
    table_rows = [{key: r[key] for key, _ in columns} for r in rows]
    return write_results(args.results, "trigger_sweep",
                         "Trigger sweep: delivery latency and archive lag per trigger", table_rows, columns, notes,
                         settings_of(args), args.command, _plot(rows), memory.peaks(), runs_table(args),
                         memory.peak_breakdown())


def _plot(rows: list[dict]):
    from matplotlib.ticker import FuncFormatter, SymmetricalLogLocator

    from bench.lags import plot_lag
    from bench.report import pyplot

    plt = pyplot()
    figure, (latency, lag) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r["trigger"] for r in rows]
    for key, style in (("p50_s", "o-"), ("p95_s", "s-"), ("p99_s", "^-"), ("max_s", "x:")):
        latency.plot(labels, [r[key] or 0 for r in rows], style, label=key.split("_")[0])
    latency.set_yscale("symlog", linthresh=0.1)
    latency.yaxis.set_major_locator(SymmetricalLogLocator(base=10, linthresh=0.1, subs=(1.0, 2.0, 3.0, 5.0)))
    latency.yaxis.set_major_formatter(FuncFormatter(lambda seconds, _: f"{seconds:g}"))  # 0.5, 2, 5: not 10^0
    latency.set_xlabel("delivery trigger")
    latency.set_ylabel("delivery latency (s)")
    latency.legend()
    latency.set_title("Per-match delivery latency")
    plot_lag(lag, [(row["trigger"], row["archive_lag"]) for row in rows], "Archive lane lag (running beside delivery)",
             "delivery trigger")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.trigger_sweep", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
