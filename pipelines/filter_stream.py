"""The stream job: Kafka alerts -> every filter in one pass -> per-broker topics, and a Delta night archive.

    spark-submit pipelines/filter_stream.py [--config conf/local.yaml] [--topic T]
        [--filters-dir DIR] [--brokers FILE] [--trigger 0 | 5s | realtime | --available-now]
        [--lane both | delivery | archive]

Two lanes, each its own streaming query with its own checkpoint (under
``<state_dir>/checkpoints/<name>/<lane>``), so a restart resumes where each
stopped: the *delivery* lane (latency first: decode, filter, cap, write to
Kafka; nothing else on its path) and the *archive* lane (throughput first:
Delta tables, exactly once, on a slower trigger).  Works the same under
``python pipelines/filter_stream.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.job_config import add_common_arguments, config_from_args, job_main  # noqa: E402
from pipelines.kafka_watch import wait_until_reachable  # noqa: E402
from pipelines.realtime import auto_trigger, slots_needed  # noqa: E402
from pipelines.session import get_spark  # noqa: E402
from pipelines.stream_job import REALTIME, StreamJob, Triggers, duration  # noqa: E402
from pipelines.stream_plan import build_plan, wait_for_schema  # noqa: E402
from pipelines.totals import StreamTotals, summary_lines  # noqa: E402
from skyfilter.config import Config  # noqa: E402
from skyfilter.kafka_clients import act_as  # noqa: E402
from skyfilter.topics import topic_partitions  # noqa: E402

LANES = {"both": {"delivery", "archive"}, "delivery": {"delivery"}, "archive": {"archive"}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="filter_stream.py",
        description="Read alerts from Kafka, apply every SQL and Python filter in one pass, write each match "
                    "to its broker's topic (header 'filters' lists the filters it matched): the delivery lane. "
                    "Beside it, the archive lane writes every alert, match and per-batch metric to Delta tables "
                    "partitioned by night, exactly once, without ever delaying delivery.")
    parser.add_argument("--topic", help="input topic (default: topics.alerts)")
    parser.add_argument("--name", help="name of this stream's checkpoint and Delta tables (default: the topic)")
    parser.add_argument("--filters-dir", help="folder of *.sql and *.py filters (default: stream.filters_dir)")
    parser.add_argument("--brokers", help="brokers file (default: stream.brokers)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--trigger", help="delivery lane: 0 = micro-batches back to back, a duration like 500ms or 5s, "
                                        "realtime = Spark's Real-time Mode for the brokers it can serve (the others "
                                        "in micro-batches beside it), or auto = realtime when it can serve every "
                                        "broker, else 0 (default: stream.trigger)")
    when.add_argument("--available-now", action="store_true",
                      help="process what is in the topic now (delivery, then archive), then exit 0 "
                           "(tests, replays, scripts)")
    parser.add_argument("--lane", choices=sorted(LANES), default="both",
                        help="run both lanes (default), or only one of them (e.g. the archive in its own process)")
    parser.add_argument("--archive-trigger", help="archive lane trigger, e.g. 10s (default: archive.trigger)")
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
                                  "stream.trigger": args.trigger, "topics.alerts": args.topic,
                                  "archive.trigger": args.archive_trigger})
    return act_as(cfg, "pipeline")


def triggers(cfg: Config, available_now: bool, log=print) -> Triggers:
    """Each lane's trigger from the config (checked here, so a typo is one line before Spark starts)."""
    if available_now:
        return Triggers("availableNow", "availableNow", "")
    delivery = str(cfg.get("stream.trigger")).strip().lower()
    if delivery == "auto":
        delivery, why = auto_trigger(cfg.path("stream.filters_dir"), cfg.path("stream.brokers"))
        log(f"trigger auto -> {delivery}: {why}")
    if delivery != REALTIME:
        delivery = "0s" if duration(delivery) == "0 seconds" else delivery
    archive = str(cfg.get("archive.trigger")).strip()
    duration(archive)
    return Triggers(delivery, archive, duration(cfg.get("stream.realtime.checkpoint_interval")))


def session_for(cfg: Config, topic: str, name: str, realtime: bool):
    """The SparkSession; for Real-time Mode a local master gets one task slot per input partition (and room
    for the other lanes) when it has fewer."""
    if not realtime:
        return get_spark(f"skyfilter-filter-stream-{name}")
    from pyspark import SparkConf

    master = SparkConf().get("spark.master", "local[2]")
    need = slots_needed(topic_partitions(cfg, topic) or int(cfg.get("topics.alerts_partitions")))
    local = master.startswith("local[") and master[6:-1].isdigit()
    if local and int(master[6:-1]) < need:
        print(f"realtime: Spark master {master} -> local[{need}] (one task slot per input partition)", flush=True)
        return get_spark(f"skyfilter-filter-stream-{name}", master=f"local[{need}]")
    return get_spark(f"skyfilter-filter-stream-{name}")


def run(args: argparse.Namespace, spark=None, log=print) -> StreamTotals:
    """Run the stream job until it is told to stop (or, with --available-now, until caught up)."""
    cfg = load_config(args)
    topic = str(cfg.get("topics.alerts"))
    name = args.name or topic
    lanes = LANES[args.lane]
    plan_triggers = triggers(cfg, args.available_now, log)
    wait_until_reachable(cfg, float(cfg.get("kafka.connect_wait_s")), log)
    wait = args.wait_for_schema if args.wait_for_schema is not None else (0 if args.available_now else 1e9)
    schema = wait_for_schema(cfg, topic, wait, log)
    if schema is None:
        log(f"nothing to do: no schema is registered for topic '{topic}' (nothing was produced to it)")
        return StreamTotals()
    spark = spark or session_for(cfg, topic, name, plan_triggers.delivery == REALTIME and "delivery" in lanes)
    plan = build_plan(spark, cfg, topic, name, cfg.path("stream.filters_dir"), cfg.path("stream.brokers"), schema)
    for problem in plan.problems:
        log(f"filter problem: {problem}")
    log(f"stream '{name}': topic '{topic}' (schema id {plan.schema_id}, {plan.columns.family}), "
        f"{len(plan.filters)} filter(s) enabled for {len(plan.brokers)} broker(s)")
    job = StreamJob(spark, cfg, plan, plan_triggers, lanes, log)
    try:
        job.start()
        running = ", ".join(f"{lane} (trigger {_label(job, lane)})" for lane in ("realtime", "delivery", "archive")
                            if lane in job.queries or (lane == "archive" and job.archive is not None))
        log(f"stream '{name}' running: {running}; master {spark.sparkContext.master}, checkpoints {plan.checkpoint}")
        if args.available_now:
            job.run_available_now()
        else:
            job.wait(args.stop_when_idle)
    finally:
        job.stop()
        job.close()
    return job.totals


def _label(job: StreamJob, lane: str) -> str:
    return {"realtime": f"realtime {job.triggers.realtime_interval}", "delivery": job.delivery.trigger
            if job.delivery else "-", "archive": job.triggers.archive}[lane]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def work() -> None:
        for line in summary_lines(run(args)):
            print(line)

    return job_main("filter_stream", work)


if __name__ == "__main__":
    sys.exit(main())
