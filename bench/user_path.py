"""Latency as users start the stream: `spark-submit`, a new `--name` on a topic that already holds alerts.

    python -m bench.user_path [--variants both,delivery:--lane=delivery]
                              [--seconds 60] [--rate 256] [--backlog-visits 2] [--restart-at 0] [--trigger realtime]

The other benchmarks warm a stream up on a fresh topic before they measure; an
operator's night does not.  Per variant (a name and the ``--set`` settings that
make it), this one:

1. fills a fresh topic with ``--backlog-visits`` visits (alerts from before the
   stream starts, which ``--starting-offsets auto`` does not read);
2. starts ``spark-submit pipelines/filter_stream.py`` under a new ``--name``, both
   lanes, as an operator does, and waits for its ``running:`` line plus 10 s;
3. sends ``--rate`` simulated Rubin alerts a second (one visit each, with
   cutouts) for ``--seconds``, the broker-like mix of filters
   (``bench/filter_sets.py``); with ``--restart-at S`` the job is killed (``kill -9``,
   its whole process group) S seconds into sending and started again at once;
   measured then: when it said ``running:`` again, when the alerts sent before
   that (the backlog) were all delivered, and the p99 of the alerts sent from
   ``running:`` + 60 s on (issue 48's restart target);
4. waits until the broker topics stop growing, stops the job with SIGTERM
   and reads every broker topic back.

Before the first run, ``--kafka-warm-up`` seconds of the same load go through a
scratch topic and back (``bench.harness.warm_kafka``): the runs meet a Kafka as
warm as a long-running one, not one compiling its own request path.

The job's Prometheus endpoint is scraped every ``--scrape-every`` seconds
while it sends (until the kill, in a restart run), and each scrape is set against what
was delivered and appended by then (``bench/metrics_scrape.py``): how old the
latency histograms' count, the alerts-read counter and the lag were (issue 49's
target: no older than 10 s with a scrape every 5 s).

A variant with the setting ``master=cluster`` is submitted with ``--master`` to a
local standalone cluster the benchmark starts (master + 2 workers of
``--cluster-cores`` cores): the same load on a cluster beside a local master, e.g.
``--variants local,cluster:master=cluster --set archive.process=separate``.

Measured: delivery latency of every match (its broker message's Kafka
timestamp minus its alert's input timestamp, from the first alert sent),
p50-p99.9 and max, also for the brokers with a Python filter; the archive's
lag when sending ended and how long it took to hold every alert sent; CPU
per part (the job's driver side, its archive process, Kafka, the rest).
Writes ``user_path.{json,csv,md,png}``, and the same latencies by window
(``bench/latency_windows.py``: the first 10 s, 10-30 s, each later minute, the
minutes holding a Real-time checkpoint apart; CPU per part over the first 10 s
and 30 s) to ``user_path_windows.{json,csv,md,png}``, with each kind of window's
p99 of both lanes against delivery alone when both ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from bench.broker_load import (
    PERCENTILES,
    QUIET_S,
    SPREAD_S,
    _s,
    percentile,
    plot_latency_tail,
    target_notes,
    wait_until_quiet,
)
from bench.filter_sets import CUTS
from bench.harness import add_common_arguments, add_settings_argument, runs_table, settings_of
from bench.latency_windows import EARLY_S, FIRST_S, checkpoint_commits, write_windows
from bench.metrics_scrape import MetricsScraper, freshness
from bench.submitted_job import Job, spark_cluster
from skyfilter.core.lane_names import LaneName
from skyfilter.local.processes import free_port

TARGETS = {"realtime": {"p99_s": 0.2, "p999_s": 0.5, "python_p99_s": 0.3, "backlog_cleared_s": 60.0,
                        "recovered_p99_s": 0.2, "metrics_delivered_stale_max_s": 10.0},
           "0": {"p99_s": 2.0, "metrics_delivered_stale_max_s": 10.0}}
CLUSTER_SETTING = "master=cluster"  # a variant submitted to a local standalone cluster (master + 2 workers)
SETTLE_S = 10.0  # after `running:`, as the independent probe of issue 48 waited
RECOVERY_S = 60.0  # after a restart's `running:`, delivery is to be back under its target (issue 48)
CPU_MARKS_S = (FIRST_S, EARLY_S)  # CPU per part is also given for the first this many seconds of sending


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.user_path",
        description="Delivery latency of the stream job started as operators start it (spark-submit, a new --name "
                    "on a topic that already holds alerts, optionally killed and restarted mid-night), per variant "
                    "of its settings.")
    parser.add_argument("--variants", default="both,delivery:--lane=delivery",
                        help="runs, comma-separated, each NAME:KEY=VALUE+KEY=VALUE... (settings of that run's "
                             "stream; --FLAG=VALUE: a flag of its command line, e.g. --lane=delivery; NAME alone: "
                             "the defaults; default: both lanes, then delivery alone)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of sending per run (default 60)")
    parser.add_argument("--rate", type=int, default=256, help="alerts per second, one visit each (default 256)")
    parser.add_argument("--backlog-visits", type=int, default=2,
                        help="visits on the topic before the stream starts (default 2)")
    parser.add_argument("--restart-at", type=float, default=0.0,
                        help="kill -9 the job this many seconds into sending and start it again (default 0: never)")
    parser.add_argument("--trigger", default="realtime", help="the delivery trigger (default realtime)")
    parser.add_argument("--scrape-every", type=float, default=5.0,
                        help="seconds between scrapes of the job's metrics while sending (default 5; 0: none)")
    parser.add_argument("--kafka-warm-up", type=float, default=30.0,
                        help="seconds of the load sent through a scratch topic (and read back) before the first run, "
                             "so that the runs meet a Kafka as warm as a long-running one (default 30; 0: as cold "
                             "as a fresh `make demo`'s)")
    parser.add_argument("--cached-visits", type=int, default=20, help="distinct visits cycled through (default 20)")
    parser.add_argument("--filters", type=int, default=100, help="generated filters (default 100)")
    parser.add_argument("--python-filters", type=int, default=10, help="of which Python (default 10)")
    parser.add_argument("--brokers", type=int, default=20, help="brokers (default 20)")
    parser.add_argument("--cuts", choices=CUTS, default="tight", help="filter cuts (default tight)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    parser.add_argument("--cluster-cores", type=int, default=5,
                        help=f"cores each of the 2 workers offers to a '{CLUSTER_SETTING}' variant, which this "
                             f"benchmark starts a local standalone cluster for (default 5, as docker/ does)")
    add_settings_argument(parser, "a config setting of every run's stream")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def parse_variants(text: str) -> list[tuple[str, list[str]]]:
    """'a:x=1+y=2,b' -> [('a', ['x=1', 'y=2']), ('b', [])]."""
    variants = []
    for item in text.split(","):
        name, _, settings = item.strip().partition(":")
        variants.append((name, [s for s in settings.split("+") if s]))
    return variants


def run_variant(cfg, args, cached: Path, schema: dict, run_id: str, variant: str, settings: list[str],
                kafka_node, cluster=None) -> dict:
    """One variant: backlog, start, settle, send (and restart), drain; its latencies, archive lag and CPU.
    ``cluster``: the local standalone cluster (a running ``SparkStandalone``) a ``master=cluster`` variant
    is submitted to."""
    from bench.alert_cache import CachedSource
    from bench.cpu import cpu_now, cpu_used
    from bench.filter_sets import write_broker_load
    from skyfilter.archive.delta_appends import exists
    from skyfilter.producers.command import send_source

    safe = variant.replace("-", "_").replace(".", "_")
    topic, name = f"bench.path.{run_id}.{safe}", f"path_{run_id}_{safe}"
    filters, brokers_file, brokers = write_broker_load(
        args.state_dir / "filter_sets" / "user_path", args.filters, args.python_filters, args.brokers, 20, 4,
        args.cuts)
    send_source(cfg, topic, CachedSource(cached, args.backlog_visits, schema), schema, 0.0, 1, False)
    argv = ["--topic", topic, "--name", name, "--filters-dir", str(filters), "--brokers", str(brokers_file),
            "--trigger", args.trigger, "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir)]
    on_cluster = CLUSTER_SETTING in settings
    submit = ("--master", cluster.master_url) if on_cluster else ()
    daemons = (lambda: tuple(p for d in [cluster.master, *cluster.worker_daemons()] if (p := d.pid()))) \
        if on_cluster else tuple
    for setting in [*args.sets, *[s for s in settings if s != CLUSTER_SETTING]]:
        flag, _, value = setting.partition("=")
        argv += [flag, value] if flag.startswith("--") else ["--set", setting]
    archives = "--lane=delivery" not in settings
    scraping = args.scrape_every > 0 and "monitoring.port=null" not in settings  # a run without the endpoint
    if scraping:
        port = free_port(19464)
        argv += ["--set", f"monitoring.port={port}", "--set", f"monitoring.archive_port={free_port(port + 1)}"]
    log_file = cfg.state_dir / "run" / f"user_path.{safe}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    job = Job(argv, log_file, submit)
    restarted_at, running_again, scraper, scrapes, scraped_until = None, None, None, [], None
    try:
        job.wait_running()
        time.sleep(SETTLE_S)
        scraper = MetricsScraper(cfg, f"http://127.0.0.1:{port}/metrics", topic, args.scrape_every).start() \
            if scraping else None
        measured_from = time.time()
        cpu_before, cpu_spent = cpu_now(job.process.pid, kafka_node(), daemons()), None
        sent: list = []
        sender = threading.Thread(target=lambda: sent.append(send_source(
            cfg, topic, CachedSource(cached, max(1, round(args.seconds)), schema), schema, 1.0, args.producers,
            progress=not args.quiet, spread_s=SPREAD_S)), daemon=True)
        sender.start()
        marks = cpu_marks(lambda: cpu_now(job.process.pid, kafka_node(), daemons()), cpu_before, measured_from)
        if args.restart_at:
            time.sleep(args.restart_at)
            cpu_spent = cpu_used(cpu_before, cpu_now(job.process.pid, kafka_node(), daemons()))
            scrapes, scraped_until = (scraper.stop(), time.time()) if scraper is not None else ([], None)
            scraper = None  # the restarted job counts from 0 again: freshness is judged before the kill
            job.kill()
            restarted_at = time.time() - measured_from
            job = Job(argv, log_file, submit)
            cpu_before = cpu_now(job.process.pid, kafka_node(), daemons())
            job.wait_running()
            running_again = job.running_at - measured_from
        sender.join()
        report = sent[0]
        sending_ended = time.time()
        if scraper is not None:
            scrapes, scraped_until = scraper.stop(), sending_ended
        alerts_table = cfg.state_dir / "delta" / name / "alerts"
        lag_at_end = None if not archives else \
            report.alerts - (_rows(alerts_table, measured_from) if exists(alerts_table) else 0)
        archived_after = _wait_archived(alerts_table, measured_from, report.alerts, 900) if archives else None
        archived_s = None if archived_after is None else round(archived_after - sending_ended, 1)
        wait_until_quiet(cfg, [f"filtered.{broker}" for broker in brokers], QUIET_S, 600)
        cpu = cpu_used(cpu_before, cpu_now(job.process.pid, kafka_node(), daemons()))
        if cpu_spent is not None:
            cpu = {part: round(cpu[part] + cpu_spent[part], 1) for part in cpu}
    finally:
        code = job.stop() if job.process.poll() is None else job.process.returncode
    found = _sent_and_latency(cfg, brokers, measured_from)
    boundaries = checkpoint_commits(cfg.checkpoint_dir / name / LaneName.REALTIME, measured_from)
    every = sorted(ms for values in found.values() for _, ms in values)
    python = sorted(ms for broker, values in found.items() if brokers[broker]["python"] for _, ms in values)
    timeline = sorted((sent_ms / 1000 - measured_from, ms) for values in found.values() for sent_ms, ms in values)
    delivered_at = sorted((sent_ms + ms) / 1000 for values in found.values() for sent_ms, ms in values)
    return {"variant": variant, "settings": " ".join(settings) or "defaults", "alerts": report.alerts,
            "messages": len(every), **{key: _s(percentile(every, q)) for key, q in PERCENTILES},
            "max_s": _s(every[-1] if every else None), "python_messages": len(python),
            **{f"python_{key}": _s(percentile(python, q)) for key, q in PERCENTILES if key != "p50_s"},
            "restarted_at_s": None if restarted_at is None else round(restarted_at, 1),
            **after_restart(timeline, running_again),
            "archive_lag_at_end": lag_at_end, "archived_s_after_sending": archived_s,
            **{f"metrics_{key}": value for key, value in freshness(
                scrapes, delivered_at, args.rate, measured_from, scraped_until or measured_from).items()},
            "cpu_driver_s": cpu["driver"], "cpu_archive_s": cpu["archive"], "cpu_kafka_s": cpu["kafka"],
            "cpu_cluster_s": cpu["cluster"] if on_cluster else None, "cpu_other_s": cpu["other"],
            "exit_code": code, "latencies_ms": every, "timeline": timeline, "boundaries_s": boundaries,
            "cpu_marks": marks}


def cpu_marks(now, before: dict[str, float], since: float) -> dict[float, dict[str, float]]:
    """CPU seconds per part used from ``since`` to each of :data:`CPU_MARKS_S` seconds after it, filled in by a
    thread as the run passes them (``now``: the parts' CPU so far)."""
    from bench.cpu import cpu_used

    marks: dict[float, dict[str, float]] = {}

    def take() -> None:
        for mark in CPU_MARKS_S:
            time.sleep(max(0.0, since + mark - time.time()))
            try:
                marks[mark] = cpu_used(before, now())
            except Exception:  # noqa: BLE001 - a process gone (killed in a restart run): no mark
                return

    threading.Thread(target=take, daemon=True).start()
    return marks


def after_restart(timeline: list[tuple[float, float]], running_at: float | None) -> dict:
    """How delivery came back after a restart whose ``running:`` line came ``running_at`` s into sending.

    ``timeline``: (alert sent, s into sending; its latency, ms) of every message.
    The backlog is what was sent before ``running:``; it is cleared when the
    last of its messages arrives.  The target's p99 is of the alerts sent from
    ``running:`` + :data:`RECOVERY_S` on.
    """
    if running_at is None:
        return {"running_again_s": None, "backlog_cleared_s": None, "recovered_p99_s": None}
    backlog = [sent + ms / 1000 for sent, ms in timeline if sent < running_at]
    later = sorted(ms for sent, ms in timeline if sent >= running_at + RECOVERY_S)
    return {"running_again_s": round(running_at, 1),
            "backlog_cleared_s": round(max(backlog) - running_at, 1) if backlog else None,
            "recovered_p99_s": _s(percentile(later, 0.99))}


def _rows(table: Path, since: float) -> int:
    """Rows of an ``alerts`` table whose alert was appended to the input topic after ``since``."""
    import datetime as dt

    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    return DeltaTable(str(table)).to_pyarrow_dataset().count_rows(
        filter=ds.field("kafka_timestamp") >= dt.datetime.fromtimestamp(since, dt.UTC))


def _wait_archived(table: Path, since: float, expected: int, timeout_s: float) -> float | None:
    """When the archive's ``alerts`` table held the ``expected`` alerts sent after ``since`` (None: not within
    ``timeout_s``)."""
    from skyfilter.archive.delta_appends import exists

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exists(table) and _rows(table, since) >= expected:
            return time.time()
        time.sleep(1.0)
    return None


def _sent_and_latency(cfg, brokers: dict[str, dict], since: float) -> dict[str, list[tuple[int, float]]]:
    """Per broker, (input time ms, latency ms) of every message of an alert sent after ``since``."""
    from skyfilter.kafka.read_back import read_topic

    found: dict[str, list[tuple[int, float]]] = {}
    for broker in brokers:
        found[broker] = [(int(m.headers["input_time"]), m.latency_ms)
                         for m in read_topic(cfg, f"filtered.{broker}", timeout=30)
                         if m.latency_ms is not None and int(m.headers["input_time"]) >= since * 1000]
    return found


def verdicts(rows: list[dict], trigger: str) -> list[str]:
    """Each run against the targets of its trigger."""
    targets = TARGETS["realtime" if trigger == "realtime" else "0"]
    return [note for row in rows for note in target_notes(row["variant"], row, targets)]


ALONE_SETTING = "--lane=delivery"


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run every variant; returns the result files."""
    from bench.alert_cache import cached_visits
    from bench.harness import bench_kafka, bench_schema, kafka_pid, warm_kafka
    from bench.report import write_results
    from skyfilter.local.memory import RssSampler

    variants = parse_variants(args.variants)
    run_id = time.strftime("%Y%m%d%H%M%S")
    rows = []
    with bench_kafka(args.state_dir, args.bootstrap, sets=args.sets) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, min(args.cached_visits, max(1, round(args.seconds))),
                               args.rate, args.stamps, progress=not args.quiet)
        warm_kafka(cfg, cached, schema, args.kafka_warm_up, args.producers)
        with RssSampler({"benchmark and job": lambda: os.getpid(), "kafka": kafka_pid(cluster)}) as memory, \
                spark_cluster(cfg, args.state_dir, args.cluster_cores,
                              any(CLUSTER_SETTING in s for _, s in variants)) as standalone:
            for variant, settings in variants:
                rows.append(run_variant(cfg, args, cached, schema, run_id, variant, settings, kafka_pid(cluster),
                                        standalone))
    columns = [("variant", "variant"), ("settings", "settings"), ("alerts", "alerts"),
               ("messages", "broker messages"), ("p50_s", "p50 s"), ("p95_s", "p95 s"), ("p99_s", "p99 s"),
               ("p999_s", "p99.9 s"), ("max_s", "max s"), ("python_p99_s", "Python brokers p99 s"),
               ("restarted_at_s", "killed and restarted at s"), ("running_again_s", "running: again at s"),
               ("backlog_cleared_s", "backlog cleared s after running:"),
               ("recovered_p99_s", f"p99 s from running: + {RECOVERY_S:g} s"),
               ("archive_lag_at_end", "archive lag at end"),
               ("archived_s_after_sending", "all archived s after sending"),
               ("metrics_scrapes", "scrapes"), ("metrics_delivered_stale_max_s", "latency count max s old"),
               ("metrics_read_behind_max_s", "alerts read max s behind"),
               ("metrics_lag_shown_max_s", "lag shown max s"), ("cpu_driver_s", "CPU s: driver"),
               ("cpu_archive_s", "CPU s: archive"), ("cpu_kafka_s", "CPU s: Kafka"),
               ("cpu_cluster_s", "CPU s: cluster (executors, workers)"),
               ("cpu_other_s", "CPU s: producers, rest"), ("exit_code", "exit")]
    notes = [f"Per variant: a fresh topic holding {args.backlog_visits} visit(s) of {args.rate} alerts; "
             f"`spark-submit pipelines/filter_stream.py --trigger {args.trigger}` under a new --name (both lanes, "
             f"--starting-offsets auto); {SETTLE_S:g} s after its running: line, {args.rate} simulated Rubin alerts "
             f"(with cutouts) a second for {args.seconds:g} s from {args.producers} producer process(es); the "
             f"broker-like mix: {args.filters} filters ({args.python_filters} Python) over {args.brokers} brokers.",
             "Latency: each broker message's Kafka timestamp minus its alert's input timestamp, every alert sent "
             "counted (no warm-up).",
             f"Metrics: the job's endpoint scraped every {args.scrape_every:g} s while sending (until the kill in "
             f"a restart run); 'latency count max s old': the oldest delivery the histograms did not count yet at a "
             f"scrape; 'alerts read max s behind': appended minus counted as read, at the sending rate (it holds "
             f"the stream's own lag too).", *verdicts(rows, args.trigger)]
    table_rows = [{key: r.get(key) for key, _ in columns} for r in rows]
    write_windows(args, rows, memory, ALONE_SETTING)
    return write_results(args.results, "user_path", "Started as users start it: latency per variant",
                         table_rows, columns, notes, settings_of(args), args.command, _plot(rows), memory.peaks(),
                         runs_table(args), memory.peak_breakdown())


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, (tail, over_time) = plt.subplots(1, 2, figsize=(11, 4))
    plot_latency_tail(tail, [(row["variant"], row["latencies_ms"]) for row in rows],
                      "Latency tail per variant (p99 and p99.9 dotted)")
    for row in rows:
        over_time.scatter([t for t, _ in row["timeline"]], [ms / 1000 for _, ms in row["timeline"]], s=3,
                          label=row["variant"])
        if row["restarted_at_s"] is not None:
            over_time.axvline(row["restarted_at_s"], color="gray", linestyle="--", linewidth=0.8)
        if row.get("running_again_s") is not None:
            over_time.axvline(row["running_again_s"], color="gray", linestyle=":", linewidth=0.8)
    over_time.set_yscale("log")
    over_time.set_xlabel("alert sent, s after measuring began")
    over_time.set_ylabel("delivery latency (s)")
    over_time.set_title("Latency over the run (kill dashed, running: again dotted)")
    over_time.legend(fontsize="small")
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.user_path", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
