"""Sustained rate: a long night at Rubin's rate; does the consumer lag stay flat, and how does memory behave?

    python -m bench.sustained [--minutes 30] [--alerts-per-visit 10000] [--visit-seconds 39] [--time-scale 1]
                              [--stretch 2000,5000,10000,20000]

``--minutes`` simulated minutes of visits of ``--alerts-per-visit`` alerts
every ``--visit-seconds``.  ``--time-scale f`` keeps the rate but divides
the visit size, the interval and the per-visit cap by f, so the run lasts minutes/f real
minutes and brokers receive Rubin's rate of messages.
The stream runs both lanes (delivery trigger ``--trigger``, 0 by default); the
resident memory of the driver (JVM, executor and Python workers) and of Kafka
is sampled every second, and each lane's lag (alerts produced but not yet
delivered, or not yet archived) is followed over time.  ``--stretch`` then
runs a short night (``--stretch-minutes``) per visit size, smallest first, to
find the largest visit size still kept up with (Rubin's stretch goal: 100,000
per visit).  Kept up: neither lag grows (its slope over the second half of the
night is at most 5% of the offered rate).

A night at Rubin's rate writes about 0.13 GB per thousand alerts to the Delta archive
and as much to Kafka: ``--retention-minutes`` keeps only that long of the input in Kafka
(as a telescope's alert topic would), each night's data is deleted once its figures are
taken (``--keep-nights`` keeps it), and a night that would not fit on the disk is
refused before it starts.
Writes ``sustained.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from bench.harness import add_common_arguments, add_stream_arguments, runs_table, settings_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sustained",
        description="Consumer lag and memory over a long night at Rubin's rate; then the largest visit kept up with.")
    parser.add_argument("--minutes", type=float, default=30, help="simulated minutes of the main run (default 30)")
    parser.add_argument("--alerts-per-visit", type=int, default=10000, help="alerts per visit (default 10000)")
    parser.add_argument("--visit-seconds", type=float, default=39.0, help="seconds between visits (default 39)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="divide visit size and interval by this (same rate, shorter run; default 1)")
    parser.add_argument("--stretch", default="", help="visit sizes to try after the main run, e.g. 2000,5000,10000")
    parser.add_argument("--stretch-minutes", type=float, default=5, help="simulated minutes per stretch run (5)")
    parser.add_argument("--filters", type=int, default=100, help="generated SQL filters (default 100)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers the filters are spread over (default 20)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    parser.add_argument("--trigger", default="0", help="delivery trigger: seconds or realtime (default 0)")
    parser.add_argument("--format", default="full", choices=["full", "nocutouts", "lite"],
                        help="the brokers' format (default full)")
    parser.add_argument("--cap", default="20", help="alerts per visit and broker, or none (default 20, Rubin's; "
                                                    "divided by --time-scale, as the visit; realtime serves only none)")
    parser.add_argument("--cached-visits", type=int, default=5, help="distinct visits simulated, then cycled (5)")
    parser.add_argument("--keep-nights", action="store_true",
                        help="keep each measured night's Delta tables, checkpoints and input topic (by default they "
                             "are deleted once its figures are taken: a long night holds tens of GB, and the next "
                             "needs the disk)")
    parser.add_argument("--retention-minutes", type=float,
                        help="keep each night's input in Kafka only this long, as a telescope's alert topic would "
                             "(Kafka deletes older segments; the archive keeps every alert); default: the topics' "
                             "configured retention. Long runs need it to fit on one disk")
    add_stream_arguments(parser)
    add_common_arguments(parser)
    return parser.parse_args(argv)


def night(cfg, spark, args, schema: dict, alerts_per_visit: int, minutes: float, label: str, run_id: str,
          memory) -> dict:
    """One night at a visit size: each lane's lag over time, delivery latency, and whether both kept up."""
    from bench.alert_cache import CachedSource, cached_visits
    from bench.filter_sets import cap_value, write_filter_set
    from bench.lags import lag_growth, lag_timeline, lane_batches
    from bench.stream_runner import register_topic, start_stream
    from skyfilter.producers.command import send_source

    per_visit = max(1, round(alerts_per_visit / args.time_scale))
    interval = args.visit_seconds / args.time_scale
    visits = max(1, round(minutes * 60 / args.visit_seconds))
    cached = cached_visits(args.state_dir / "cache", schema, min(visits, args.cached_visits), per_visit, args.stamps,
                           progress=not args.quiet)
    topic, name = night_names(run_id, label)
    filters, brokers = write_filter_set(args.state_dir / "filter_sets" / f"sustained_{args.filters}",
                                        args.filters, "sql", args.brokers, args.format,
                                        scaled_cap(cap_value(args.cap), args.time_scale))
    register_topic(cfg, topic, schema, settings=retention_settings(args.retention_minutes))
    check_disk(args.state_dir, cached, visits * per_visit, args.retention_minutes, per_visit / interval)
    trigger = args.trigger if args.trigger == "realtime" else f"{args.trigger}s"
    stream = start_stream(cfg, spark, topic, name, filters, brokers, trigger, archive_trigger=args.archive_trigger,
                          log_trigger=args.log_trigger, sets=args.sets)
    began = time.time()
    reports: list = []
    producer = threading.Thread(target=lambda: reports.append(send_source(
        cfg, topic, CachedSource(cached, visits, schema), schema, interval, args.producers, False)))
    producer.start()
    try:
        producer.join()
        if not reports:
            raise RuntimeError("the producers failed; see the log above")
        stream.wait_for_alerts(reports[0].alerts, timeout_s=max(600.0, visits * interval * 4))
    finally:
        stream.stop(spark)
    report = reports[0]
    metrics = args.state_dir / "delta" / name / "metrics"
    sent = [(v.finish, v.alerts) for v in report.visits]
    delivery = lag_timeline(sent, _delivered(spark, args.state_dir / "delta" / name / "matches", report.visits)
                            if args.trigger == "realtime" else lane_batches(spark, metrics, ("delivery",)), began)
    archive = lag_timeline(sent, lane_batches(spark, metrics, ("archive",)), began)
    last_sent = max(v.finish for v in report.visits)
    latency = spark.sql(f"""
        SELECT percentile(ms, 0.5) AS p50, percentile(ms, 0.99) AS p99, max(delivered_at) AS last
        FROM (SELECT unix_millis(delivered_at) - unix_millis(kafka_timestamp) AS ms, delivered_at
              FROM delta.`{args.state_dir / 'delta' / name / 'matches'}`)""").first()
    growth = {lane: lag_growth(points, last_sent - began) for lane, points in (("delivery", delivery),
                                                                               ("archive", archive))}
    allowed = 0.05 * per_visit / interval
    samples = [(t, r) for t, r in memory.samples if began - memory.began <= t]
    return {"run": label, "alerts_per_visit": alerts_per_visit, "visit_s": round(interval, 2), "visits": visits,
            "alerts": report.alerts, "offered_per_s": round(per_visit / interval, 1),
            "delivery_max_lag": max(p["lag"] for p in delivery), "delivery_growth": round(growth["delivery"], 1),
            "archive_max_lag": max(p["lag"] for p in archive), "archive_growth": round(growth["archive"], 1),
            "drain_s": round(latency["last"].timestamp() - last_sent, 1) if latency["last"] else None,
            "kept_up": growth["delivery"] <= allowed and growth["archive"] <= allowed,
            "p50_s": round((latency["p50"] or 0) / 1000, 2), "p99_s": round((latency["p99"] or 0) / 1000, 2),
            "driver_peak_mb": round(max((r["driver"] for _, r in samples), default=0)),
            "kafka_peak_mb": round(max((r["kafka"] for _, r in samples), default=0)),
            "timeline": {"delivery": delivery, "archive": archive},
            "memory": [{"t": round(t - (began - memory.began), 1), **r} for t, r in samples]}


def _delivered(spark, matches, visits) -> list[tuple[float, int]]:
    """For Real-time Mode, whose batches last a checkpoint interval: each visit counts as delivered when its last
    match was (a visit's alerts are in one cached visit, so its id tells them apart)."""
    rows = spark.read.format("delta").load(str(matches)).groupBy("visit_id") \
        .agg({"delivered_at": "max"}).collect()
    ends = sorted(r[1].timestamp() for r in rows)
    return [(end, visit.alerts) for end, visit in zip(ends, sorted(visits, key=lambda v: v.finish), strict=False)]


def night_names(run_id: str, label: str) -> tuple[str, str]:
    """A night's input topic and its stream's name (its Delta tables' and checkpoints' folder)."""
    return f"bench.sustained.{run_id}.{label}", f"sustained_{run_id}_{label}"


def drop_night(cfg, state_dir: Path, topic: str, name: str) -> None:
    """Delete a measured night's Delta tables, checkpoints, input topic and the topics named after it (dead letters,
    delivery log); its figures are taken."""
    import shutil

    from skyfilter.kafka.topics import admin_client

    for folder in ("delta", "checkpoints"):
        shutil.rmtree(state_dir / folder / name, ignore_errors=True)
    admin = admin_client(cfg)  # held until the deletion is done: a collected client cancels it
    topics = [t for t in admin.list_topics(timeout=30).topics if t == topic or t.startswith(f"{topic}.")]
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result(60)


def retention_settings(minutes: float | None) -> dict[str, str]:
    """Topic settings that keep about ``minutes`` of input: segments roll every quarter of it, so Kafka can delete
    them (its retention check runs every minute, ``conf/kafka/server.properties``)."""
    if minutes is None:
        return {}
    millis = int(minutes * 60_000)
    return {"retention.ms": str(millis), "segment.ms": str(max(10_000, millis // 4))}


def check_disk(state_dir: Path, cached: Path, alerts: int, retention_minutes: float | None, rate: float,
               spare_gb: float = 5.0) -> None:
    """Refuse, in one line, a night whose data would not fit on the disk of ``state_dir``.

    The Delta archive keeps every alert (about its message size each) and Kafka the input
    for its retention; the size per alert is the cached visits' own.
    """
    import shutil

    from skyfilter.core.errors import SkyfilterError

    per_alert = cached.stat().st_size / max(1, _cached_alerts(cached))
    in_kafka = alerts if retention_minutes is None else min(alerts, rate * (retention_minutes + 2) * 60)
    needed_gb = per_alert * (alerts + in_kafka) / 1e9
    free_gb = shutil.disk_usage(state_dir).free / 1e9
    if needed_gb + spare_gb > free_gb:
        raise SkyfilterError(f"this night needs about {needed_gb:,.0f} GB under {state_dir} (the archive keeps "
                             f"{alerts:,} alerts, Kafka {in_kafka:,.0f}) and {free_gb:,.0f} GB are free: shorten "
                             f"it, or keep less in Kafka (--retention-minutes)")


def _cached_alerts(cached: Path) -> int:
    from bench.alert_cache import CachedSource

    source = CachedSource(cached)
    return source.cached_visits * source.alerts_per_visit


def scaled_cap(cap: int | None, time_scale: float) -> int | None:
    """The per-visit cap of a time-scaled night: divided like the visit, so brokers receive Rubin's rate of
    messages (20 per 39 s visit), not ``time_scale`` times it."""
    return None if cap is None else max(1, round(cap / time_scale))


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.filter_sets import cap_value
    from bench.harness import bench_kafka, bench_schema, bench_spark, driver_and_kafka
    from bench.report import write_results

    run_id = time.strftime("%Y%m%d%H%M%S")
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        spark = bench_spark(cfg, "skyfilter-bench-sustained", args.trigger, cfg.topics.alerts_partitions)
        with driver_and_kafka(spark, cluster, 1.0) as memory:
            nights = [(args.alerts_per_visit, args.minutes, "main")] + [
                (int(v), args.stretch_minutes, f"stretch{int(v)}") for v in args.stretch.split(",") if v.strip()]
            runs = []
            for size, minutes, label in nights:
                runs.append(night(cfg, spark, args, schema, size, minutes, label, run_id, memory))
                if not args.keep_nights:
                    drop_night(cfg, args.state_dir, *night_names(run_id, label))
    columns = [("run", "run"), ("alerts_per_visit", "alerts/visit"), ("visit_s", "visit every s"),
               ("visits", "visits"), ("alerts", "alerts"), ("offered_per_s", "offered alerts/s"),
               ("delivery_max_lag", "delivery max lag"), ("delivery_growth", "delivery lag growth /s"),
               ("archive_max_lag", "archive max lag"), ("archive_growth", "archive lag growth /s"),
               ("drain_s", "drain s"), ("kept_up", "kept up"), ("p50_s", "p50 s"), ("p99_s", "p99 s"),
               ("driver_peak_mb", "driver peak MB"), ("kafka_peak_mb", "Kafka peak MB")]
    rows = [{key: r[key] for key, _ in columns} for r in runs]
    kept = [r["alerts_per_visit"] for r in rows if r["kept_up"]]
    notes = [f"Main run: {args.minutes:g} simulated minutes of {args.alerts_per_visit} alerts per "
             f"{args.visit_seconds:g} s visit, time-scaled by {args.time_scale:g} (visit size and interval divided), "
             f"simulated Rubin alerts {'with' if args.stamps else 'without'} cutouts ({args.cached_visits} distinct "
             f"visits cycled, each under its own visit id), {args.filters} SQL filters over {args.brokers} brokers "
             f"(format {args.format}, cap {args.cap} per visit and broker: "
             f"{scaled_cap(cap_value(args.cap), args.time_scale)} per time-scaled visit), delivery trigger "
             f"{args.trigger}, the archive lane beside it" + (
                 f"; Kafka kept each night's input {args.retention_minutes:g} minutes (the archive keeps it all)."
                 if args.retention_minutes is not None else "."),
             "Lag: alerts produced (visit acknowledged) minus alerts delivered (delivery batch acknowledged) or "
             "archived (archive batch committed), at every event. Growth: its least-squares slope over the second "
             "half of the sending window. Kept up: neither lag grows (slope <= 5% of the offered rate). Latency: "
             "input append time to delivery of every match.",
             "Largest visit size kept up with: " + (f"{max(kept):,} alerts per {args.visit_seconds:g} s "
                                                     f"(time-scaled by {args.time_scale:g})." if kept
                                                     else "none of the sizes tried (Rubin: 10,000; stretch "
                                                          "goal 100,000).")]
    return write_results(args.results, "sustained", "Sustained rate: lag and memory over a night", rows, columns,
                         notes, settings_of(args), args.command, _plot(runs),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def _plot(runs: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, (lag, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for result in runs:
        for lane, style in (("delivery", "-"), ("archive", ":")):
            points = result["timeline"][lane]
            lag.plot([p["t"] for p in points], [p["lag"] for p in points], style,
                     label=f"{lane}, {result['alerts_per_visit']:,}/visit" + (" (main)" if result["run"] == "main"
                                                                               else ""))
    main = runs[0]
    for process in ("driver", "kafka"):
        memory.plot([s["t"] for s in main["memory"]], [s[process] for s in main["memory"]], label=process)
    lag.set_xlabel("seconds since the first visit")
    lag.set_ylabel("lag (alerts)")
    lag.set_title("Lag")
    lag.legend(fontsize="small")
    memory.set_xlabel("seconds since the first visit (main run)")
    memory.set_ylabel("resident memory (MB)")
    memory.set_ylim(bottom=0)
    memory.set_title("Memory")
    memory.legend()
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.sustained", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
