"""Broker-like load: 100 filters (10 of them Python) over 20 brokers of every format, caps on some, at Rubin's
rate, with and without the archive lane beside delivery.

    python -m bench.broker_load [--modes realtime/both,realtime/delivery,0/both] [--seconds 60] [--rate 256]
                                [--filters 100] [--python-filters 10] [--brokers 20] [--cap 20] [--capped-every 4]

Each mode is ``trigger/lanes``: the delivery trigger, and ``both`` lanes (the
archive in its own process, as ``filter_stream.py`` runs it) or ``delivery``
alone.  Per mode, a fresh topic and a fresh stream, warmed by one visit of an
earlier night; then ``--rate`` simulated Rubin alerts every second (a visit
each, with cutouts) for ``--seconds``, cycled from a cache of serialized visits.
Measured, per mode:

* delivery latency of every broker message: its Kafka timestamp (the sink's
  send) minus its alert's input timestamp (header ``input_time``), p50, p95,
  p99, p99.9 and max; for all brokers, and for the brokers with a Python filter;
* the archive lane's lag (alerts sent, not yet archived) over the run and its
  growth (least-squares slope over the second half; flat = kept up);
* CPU per part (delivery driver, archive process, Kafka, producers and rest).

The delivery-only run is the reference the issue's target compares with: both
lanes' p95 and p99 within 1.5x of it.  Writes ``broker_load.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.filter_sets import CUTS
from bench.harness import add_common_arguments, add_settings_argument, runs_table, settings_of

TARGETS = {"realtime": {"p99_s": 0.2, "p999_s": 0.5, "python_p99_s": 1.0}, "0": {"p99_s": 2.0}}
SPREAD_S = 0.95  # each second's alerts sent evenly over this much of it: a steady rate, not a burst per second
QUIET_S = 5.0  # the broker topics are drained when they have not grown for this long
PERCENTILES = (("p50_s", 0.5), ("p95_s", 0.95), ("p99_s", 0.99), ("p999_s", 0.999))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker_load",
        description="Delivery latency of a broker-like filter set (SQL and Python filters, every format, caps) at "
                    "Rubin's rate, with both lanes and with delivery alone, and the archive lane's lag.")
    parser.add_argument("--modes", default="realtime/both,realtime/delivery,0/both",
                        help="runs as trigger/lanes, comma-separated: trigger realtime or seconds, lanes both or "
                             "delivery (default realtime/both,realtime/delivery,0/both)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of sending per run (default 60)")
    parser.add_argument("--rate", type=int, default=256, help="alerts per second, one visit each (default 256)")
    parser.add_argument("--cached-visits", type=int, default=20,
                        help="visits simulated and cached; longer runs cycle them under new ids (default 20)")
    parser.add_argument("--filters", type=int, default=100, help="generated filters (default 100)")
    parser.add_argument("--python-filters", type=int, default=10, help="of which Python (default 10)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers, formats full/nocutouts/lite in turn "
                                                                "(default 20)")
    parser.add_argument("--cap", type=int, default=20, help="alerts per visit of a capped broker (default 20)")
    parser.add_argument("--capped-every", type=int, default=4, help="every n-th broker is capped (default 4)")
    parser.add_argument("--cuts", choices=CUTS, default="tight",
                        help="tight: ~1.5%% of alerts pass each filter, ~6%% each broker; loose: ~11%% and ~20%%, the "
                             "trigger sweep's uniform cuts (default tight)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    add_settings_argument(parser, "a config setting of the benchmark and its streams")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def parse_modes(text: str) -> list[tuple[str, str]]:
    """'realtime/both,0/delivery' -> [('realtime', 'both'), ('0', 'delivery')]."""
    modes = []
    for item in text.split(","):
        trigger, _, lanes = item.strip().partition("/")
        if lanes not in ("both", "delivery"):
            raise ValueError(f"mode '{item}': lanes are both or delivery")
        modes.append((trigger, lanes))
    return modes


def load_one(cfg, spark, args, cached: Path, warm_up: Path, schema: dict, run_id: str, trigger: str, lanes: str,
             kafka_node) -> dict:
    """The load through a fresh stream in one mode; its latencies, archive lag and CPU."""
    from bench.alert_cache import CachedSource
    from bench.cpu import cpu_now, cpu_used
    from bench.filter_sets import write_broker_load
    from bench.lags import lag_growth, lag_timeline, lane_batches
    from bench.stream_runner import register_topic, start_stream
    from skyfilter.producers.command import send_source

    label = f"{trigger if trigger == 'realtime' else trigger + 's'}-{lanes}"
    topic, name = f"bench.load.{run_id}.{label}", f"load_{run_id}_{label.replace('.', '_').replace('-', '_')}"
    filters, brokers_file, brokers = write_broker_load(
        args.state_dir / "filter_sets" / "broker_load", args.filters, args.python_filters, args.brokers, args.cap,
        args.capped_every, args.cuts)
    register_topic(cfg, topic, schema)
    stream = start_stream(cfg, spark, topic, name, filters, brokers_file, trigger, sets=args.sets, lane=lanes)
    topics = [f"filtered.{broker}" for broker in brokers]
    try:
        warm = send_source(cfg, topic, CachedSource(warm_up, 1), schema, 0.0, 1, False).alerts
        wait_until_quiet(cfg, topics, QUIET_S, 600)
        measured_from = time.time()
        cpu_before = cpu_now(os.getpid(), kafka_node())
        visits = max(1, round(args.seconds))
        report = send_source(cfg, topic, CachedSource(cached, visits, schema), schema, 1.0, args.producers,
                             progress=not args.quiet, spread_s=SPREAD_S)
        if lanes == "both":
            stream.wait_for_alerts(report.alerts + warm, timeout_s=max(900, 2 * args.seconds))
        wait_until_quiet(cfg, topics, QUIET_S, 600)
        cpu = cpu_used(cpu_before, cpu_now(os.getpid(), kafka_node())) | {
            "window": round(time.time() - measured_from, 1)}
    finally:
        stream.stop(spark)
    latencies = broker_latencies(cfg, brokers, measured_from)
    every = sorted(ms for values in latencies.values() for ms in values)
    python = sorted(ms for broker, values in latencies.items() if brokers[broker]["python"] for ms in values)
    row = {"mode": label, "alerts": report.alerts, "messages": len(every),
           **{key: _s(percentile(every, q)) for key, q in PERCENTILES}, "max_s": _s(every[-1] if every else None),
           "python_messages": len(python),
           **{f"python_{key}": _s(percentile(python, q)) for key, q in PERCENTILES if key != "p50_s"},
           "cpu_driver_s": cpu["driver"], "cpu_archive_s": cpu["archive"], "cpu_kafka_s": cpu["kafka"],
           "cpu_other_s": cpu["other"], "cpu_window_s": cpu["window"]}
    first_send = min(v.start for v in report.visits)
    sending = max(v.finish for v in report.visits) - first_send
    if lanes == "both":
        lag = lag_timeline([(v.finish, v.alerts) for v in report.visits],
                           lane_batches(spark, args.state_dir / "delta" / name / "metrics", ("archive",),
                                        since=measured_from), first_send)
        row |= {"archive_max_lag": max((p["lag"] for p in lag), default=0),
                "archive_lag_growth_per_s": round(lag_growth(lag, sending), 1), "archive_lag": lag}
    row["latencies_ms"] = every
    return row


def broker_latencies(cfg, brokers: dict[str, dict], since: float) -> dict[str, list[float]]:
    """Per broker, the latency (ms) of every message whose alert was sent after ``since`` (epoch seconds)."""
    from skyfilter.kafka.read_back import read_topic

    found = {}
    for broker in brokers:
        messages = read_topic(cfg, f"filtered.{broker}", timeout=30)
        found[broker] = [m.latency_ms for m in messages
                         if m.latency_ms is not None and int(m.headers["input_time"]) >= since * 1000]
    return found


def wait_until_quiet(cfg, topics: list[str], quiet_s: float, timeout_s: float) -> None:
    """Block until the topics' total message count has not changed for ``quiet_s`` (or ``timeout_s`` passed)."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from skyfilter.kafka.clients import client_settings

    consumer = Consumer(client_settings(cfg, **{"group.id": f"skyfilter-bench-{uuid.uuid4()}", "log_level": 0}))
    try:
        def total() -> int:
            count = 0
            for topic in topics:
                metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
                for partition in (metadata.partitions if metadata is not None and metadata.error is None else {}):
                    count += consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
            return count

        deadline = time.monotonic() + timeout_s
        last, since = total(), time.monotonic()
        while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
            time.sleep(0.5)
            now = total()
            if now != last:
                last, since = now, time.monotonic()
    finally:
        consumer.close()


def percentile(values: list[float], fraction: float) -> float | None:
    """The ``fraction`` percentile of sorted ``values`` (nearest rank)."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, int(round(fraction * len(values))) - 1))]


def _s(millis: float | None) -> float | None:
    return None if millis is None else round(millis / 1000, 3)


def target_notes(label: str, row: dict, targets: dict[str, float]) -> list[str]:
    """One note per target (a row key and its bound in seconds) the row has a figure for: met or missed."""
    return [f"{label}: {key.replace('_s', '')} {row[key]:.3f} s against <= {target:g} s: "
            f"{'met' if row[key] <= target else 'missed'}"
            for key, target in targets.items() if row.get(key) is not None]


def plot_latency_tail(axis, series: list[tuple[str, list[float]]], title: str) -> None:
    """Each run's share of messages slower than a latency (ms values, sorted), log-log, p99 and p99.9 dotted."""
    for label, values in series:
        if values:
            axis.plot([v / 1000 for v in values], [1 - (i + 0.5) / len(values) for i in range(len(values))],
                      label=label)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("delivery latency (s)")
    axis.set_ylabel("share of messages slower")
    axis.axhline(0.01, color="gray", linestyle=":", linewidth=0.8)
    axis.axhline(0.001, color="gray", linestyle=":", linewidth=0.8)
    axis.legend(fontsize="small")
    axis.set_title(title)


def verdicts(rows: list[dict]) -> list[str]:
    """The targets against the rows: each mode's own, and both lanes against delivery alone."""
    notes = []
    by_mode = {row["mode"]: row for row in rows}
    for row in rows:
        notes += target_notes(row["mode"], row, TARGETS.get(row["mode"].split("-")[0].rstrip("s"), {}))
        alone = by_mode.get(row["mode"].replace("-both", "-delivery"))
        if row["mode"].endswith("-both") and alone is not None:
            for key in ("p95_s", "p99_s"):
                if row.get(key) and alone.get(key):
                    ratio = row[key] / alone[key]
                    notes.append(f"{row['mode']}: {key.replace('_s', '')} {ratio:.2f}x the delivery-only run "
                                 f"({'met' if ratio <= 1.5 else 'missed'}: <= 1.5x)")
        if "archive_lag_growth_per_s" in row:
            notes.append(f"{row['mode']}: archive lag growth {row['archive_lag_growth_per_s']} alerts/s "
                         f"(flat: within 5% of the rate)")
    return notes


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.alert_cache import EARLIER_NIGHT, cached_visits
    from bench.harness import bench_kafka, bench_schema, bench_spark, driver_and_kafka, kafka_pid
    from bench.report import write_results

    modes = parse_modes(args.modes)
    run_id = time.strftime("%Y%m%d%H%M%S")
    with bench_kafka(args.state_dir, args.bootstrap, sets=args.sets) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, min(args.cached_visits, max(1, round(args.seconds))),
                               args.rate, args.stamps, progress=not args.quiet)
        warm_up = cached_visits(args.state_dir / "cache", schema, 1, args.rate, args.stamps, progress=False,
                                night=EARLIER_NIGHT)
        partitions = cfg.topics.alerts_partitions
        spark = bench_spark(cfg, "skyfilter-bench-broker-load", modes[0][0], partitions)
        rows = []
        with driver_and_kafka(spark, cluster) as memory:
            for trigger, lanes in modes:
                spark = bench_spark(cfg, "skyfilter-bench-broker-load", trigger, partitions)
                rows.append(load_one(cfg, spark, args, cached, warm_up, schema, run_id, trigger, lanes,
                                     kafka_pid(cluster)))
    columns = [("mode", "trigger-lanes"), ("alerts", "alerts"), ("messages", "broker messages"),
               ("p50_s", "p50 s"), ("p95_s", "p95 s"), ("p99_s", "p99 s"), ("p999_s", "p99.9 s"), ("max_s", "max s"),
               ("python_messages", "Python brokers' messages"), ("python_p99_s", "Python brokers p99 s"),
               ("python_p999_s", "Python brokers p99.9 s"), ("archive_max_lag", "archive max lag"),
               ("archive_lag_growth_per_s", "archive lag growth alerts/s"), ("cpu_driver_s", "CPU s: delivery"),
               ("cpu_archive_s", "CPU s: archive"), ("cpu_kafka_s", "CPU s: Kafka"),
               ("cpu_other_s", "CPU s: producers, rest"), ("cpu_window_s", "over s")]
    capped = len([b for b in range(args.brokers) if args.capped_every and b % args.capped_every ==
                  args.capped_every - 1])
    notes = [f"{args.rate} simulated Rubin alerts (with cutouts) a second, sent evenly, for {args.seconds:g} s, "
             f"one visit a second, after one unmeasured visit of an earlier night; {args.filters} filters "
             f"({args.python_filters} Python, {args.cuts} cuts: {_cuts_note(args.cuts)}) over {args.brokers} "
             f"brokers (full, nocutouts and lite in turn; {capped} capped at {args.cap} per visit); "
             f"{args.producers} producer process(es).",
             "Latency: each broker message's Kafka timestamp (set by the stream's sink as it sends) minus its "
             "alert's input timestamp (producer send); Python brokers: those with a Python filter.",
             "Lanes both: the archive in its own process beside delivery, as filter_stream.py runs it; delivery: "
             "no archive at all (the reference).", *verdicts(rows)]
    table_rows = [{key: r.get(key) for key, _ in columns} for r in rows]
    return write_results(args.results, "broker_load", "Broker-like load: delivery latency with and without the "
                         "archive lane", table_rows, columns, notes, settings_of(args), args.command, _plot(rows),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def _cuts_note(cuts: str) -> str:
    return "~1.5% of alerts per filter" if cuts == "tight" else "~11% of alerts per filter"


def _plot(rows: list[dict]):
    from bench.lags import plot_lag
    from bench.report import pyplot

    plt = pyplot()
    figure, (latency, lag) = plt.subplots(1, 2, figsize=(11, 4))
    plot_latency_tail(latency, [(row["mode"], row["latencies_ms"]) for row in rows],
                      "Latency tail per mode (p99 and p99.9 dotted)")
    plot_lag(lag, [(row["mode"], row["archive_lag"]) for row in rows if row.get("archive_lag")], "Archive lane lag")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.broker_load", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
