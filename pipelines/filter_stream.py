"""The stream job: Kafka alerts -> every filter in one pass -> per-broker topics + Delta night archive.

    spark-submit pipelines/filter_stream.py [--config conf/local.yaml] [--topic T]
        [--filters-dir DIR] [--brokers FILE] [--trigger 5s | --available-now]

Works the same under ``python pipelines/filter_stream.py``.  Checkpoints live
under ``<state_dir>/checkpoints/<name>``, so a restart resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.batch import BatchProcessor, StreamTotals  # noqa: E402
from pipelines.job_config import add_common_arguments, config_from_args, job_main  # noqa: E402
from pipelines.kafka_watch import KafkaWatch, wait_until_reachable  # noqa: E402
from pipelines.monitoring import StreamMonitor  # noqa: E402
from pipelines.quarantine import Quarantine  # noqa: E402
from pipelines.reload import PlanReloader  # noqa: E402
from pipelines.session import get_spark  # noqa: E402
from pipelines.stream_plan import StreamPlan, build_plan, wait_for_schema  # noqa: E402
from skyfilter.config import Config  # noqa: E402
from skyfilter.errors import SkyfilterError  # noqa: E402
from skyfilter.kafka_clients import act_as, spark_sink_options, spark_source_options  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="filter_stream.py",
        description="Read alerts from Kafka, apply every SQL and Python filter in one pass, write each match "
                    "to its broker's topic (header 'filters' lists the filters it matched), and archive every "
                    "alert, match and per-batch metric to Delta tables partitioned by night.")
    parser.add_argument("--topic", help="input topic (default: topics.alerts)")
    parser.add_argument("--name", help="name of this stream's checkpoint and Delta tables (default: the topic)")
    parser.add_argument("--filters-dir", help="folder of *.sql and *.py filters (default: stream.filters_dir)")
    parser.add_argument("--brokers", help="brokers file (default: stream.brokers)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--trigger", help="processing-time trigger, e.g. 5s, 500ms, 0 = as soon as possible "
                                        "(default: stream.trigger)")
    when.add_argument("--available-now", action="store_true",
                      help="process what is in the topic now, then exit 0 (tests, replays, scripts)")
    parser.add_argument("--stop-when-idle", type=float, metavar="SECONDS",
                        help="stop after this many seconds without new alerts")
    parser.add_argument("--wait-for-schema", type=float, default=None, metavar="SECONDS",
                        help="how long to wait for a producer to register the topic's schema "
                             "(default: forever, or 0 with --available-now)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> Config:
    """The config with the command-line flags applied on top."""
    cfg = config_from_args(args, {"stream.filters_dir": args.filters_dir, "stream.brokers": args.brokers,
                                  "stream.trigger": args.trigger, "topics.alerts": args.topic})
    return act_as(cfg, "pipeline")


def trigger_options(cfg: Config, available_now: bool) -> tuple[dict, str]:
    """Keyword arguments of DataStreamWriter.trigger, and a label for the metrics."""
    if available_now:
        return {"availableNow": True}, "availableNow"
    text = str(cfg.get("stream.trigger")).strip()
    if text in ("0", "0s", "asap"):
        return {"processingTime": "0 seconds"}, "0s"
    number = text.rstrip("smh")
    unit = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours"}.get(text[len(number):] or "s")
    if not unit or not number.replace(".", "", 1).isdigit():
        raise SkyfilterError(f"trigger '{text}' is not a duration like 500ms, 5s or 1m")
    return {"processingTime": f"{number} {unit}"}, text


def status_file(cfg: Config, name: str) -> Path:
    """Where a running stream says it runs (pid, query id), for tools and the demo."""
    return cfg.run_dir / f"filter_stream.{name}.json"


def run(args: argparse.Namespace, spark=None, log=print) -> StreamTotals:
    """Run the stream job until it is told to stop (or, with --available-now, until caught up)."""
    cfg = load_config(args)
    topic = str(cfg.get("topics.alerts"))
    name = args.name or topic
    wait_until_reachable(cfg, float(cfg.get("kafka.connect_wait_s")), log)
    wait = args.wait_for_schema if args.wait_for_schema is not None else (0 if args.available_now else 1e9)
    schema = wait_for_schema(cfg, topic, wait, log)
    if schema is None:
        log(f"nothing to do: no schema is registered for topic '{topic}' (nothing was produced to it)")
        return StreamTotals()
    spark = spark or get_spark(f"skyfilter-filter-stream-{name}")
    plan = build_plan(spark, cfg, topic, name, cfg.path("stream.filters_dir"), cfg.path("stream.brokers"), schema)
    for problem in plan.problems:
        log(f"filter problem: {problem}")
    log(f"stream '{name}': topic '{topic}' (schema id {plan.schema_id}, {plan.columns.family}), "
        f"{len(plan.filters)} filter(s) enabled for {len(plan.brokers)} broker(s)")
    trigger, label = trigger_options(cfg, args.available_now)
    filters_dir, brokers_file = cfg.path("stream.filters_dir"), cfg.path("stream.brokers")
    quarantine = Quarantine(spark, cfg, plan, filters_dir, log)
    reloader = PlanReloader(spark, cfg, plan, filters_dir, brokers_file, log) \
        if cfg.get("stream.hot_reload", True) else None
    monitor = StreamMonitor(cfg, name, topic, plan.checkpoint, label, log)
    if monitor.url:
        log(f"metrics at {monitor.url}")
    try:
        processor = BatchProcessor(spark, plan, label, spark_sink_options(cfg), monitor, log, quarantine, reloader)
        processor.warm_up()
        source = (spark.readStream.format("kafka")
                  .options(**spark_source_options(cfg))
                  .option("subscribe", topic)
                  .option("startingOffsets", str(cfg.get("stream.starting_offsets")))
                  .option("maxOffsetsPerTrigger", int(cfg.get("stream.max_offsets_per_trigger")))
                  .load())
        query = (source.writeStream.queryName(f"filter_stream_{name}").foreachBatch(processor)
                 .option("checkpointLocation", str(plan.checkpoint)).trigger(**trigger).start())
        log(f"stream '{name}' running: trigger {label}, master {spark.sparkContext.master}, "
            f"checkpoint {plan.checkpoint}")
        _wait(query, cfg, plan, processor, monitor, args.stop_when_idle, log)
    finally:
        monitor.close()
    return processor.totals


def _wait(query, cfg: Config, plan: StreamPlan, processor: BatchProcessor, monitor: StreamMonitor,
          idle_s: float | None, log) -> None:
    """Block until the query ends, is signalled, or has been idle long enough; keep the status file current."""
    status = status_file(cfg, plan.name)
    status.parent.mkdir(parents=True, exist_ok=True)
    spark_context = processor.spark.sparkContext
    about = {"pid": os.getpid(), "query_id": str(query.id), "topic": plan.topic, "started_at": time.time(),
             "status": "running", "trigger": processor.trigger, "checkpoint": str(plan.checkpoint),
             "master": spark_context.master, "application_id": spark_context.applicationId,
             "metrics_url": monitor.url}
    written = None
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)} \
        if _in_main_thread() else {}
    started = time.time()
    watch = KafkaWatch(cfg, log).start()
    try:
        while query.isActive:
            monitor.tick()
            if monitor.snapshot is not written:
                written = monitor.snapshot
                totals = processor.totals
                status.write_text(json.dumps(about | written | {"totals": {
                    "input_alerts": totals.input_alerts, "archived": totals.archived,
                    "dead_letters": totals.rejected, "matches": sum(totals.matches_by_broker.values()),
                    "by_broker": dict(totals.matches_by_broker)}}, default=str))
            try:
                query.awaitTermination(1)
            except Exception as exc:  # noqa: BLE001 - StreamingQueryException and py4j errors alike
                raise _failure(cfg, plan, exc) from None
            outage = watch.over_limit()
            if outage is not None:
                query.stop()
                raise outage
            if stop["signal"] is not None:
                log(f"stopping on signal {signal.Signals(stop['signal']).name}")
                query.stop()
            elif idle_s is not None and _idle(query.status) and watch.down_since is None \
                    and time.time() - max(started, processor.totals.last_input_at, watch.back_at) > idle_s:
                log(f"no new alerts for {idle_s:.0f} s: stopping")
                query.stop()
        if query.exception() is not None:
            raise _failure(cfg, plan, query.exception())
    finally:
        watch.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        status.unlink(missing_ok=True)


def _idle(status: dict) -> bool:
    """No data waiting and no trigger under way (a trigger blocked on Kafka is not idleness)."""
    return not status.get("isDataAvailable", False) and not status.get("isTriggerActive", False)


def _failure(cfg: Config, plan: StreamPlan, exc: BaseException) -> SkyfilterError:
    """One line for the user; the whole error goes to a log file next to the status file."""
    text = str(exc)
    path = status_file(cfg, plan.name).with_suffix(".error.log")
    path.write_text(text)
    python_errors = [line.strip() for line in text.splitlines() if re.match(r"^\s*[A-Za-z_.]+(Error|Exception):", line)]
    reason = python_errors[-1] if python_errors else (text.strip().splitlines() or ["unknown error"])[0]
    return SkyfilterError(f"stream '{plan.name}' failed: {reason[:300]} (full error in {path})")


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def summary_lines(totals: StreamTotals) -> list[str]:
    """The closing summary of a run."""
    lines = [f"{totals.batches} batch(es): {totals.input_alerts} alerts in, {totals.archived} archived, "
             f"{totals.rejected} rejected"]
    lines += [f"  filter {name}: {count} matches" for name, count in sorted(totals.matches_by_filter.items())]
    lines += [f"  broker {name}: {count} alerts" + (f" ({totals.dropped_by_cap[name]} more over max_alerts_per_visit)"
                                                    if totals.dropped_by_cap[name] else "")
              for name, count in sorted(totals.matches_by_broker.items())]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work() -> None:
        for line in summary_lines(run(args)):
            print(line)

    return job_main("filter_stream", work)


if __name__ == "__main__":
    sys.exit(main())
