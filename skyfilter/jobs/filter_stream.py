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
import logging
import os
import sys

from skyfilter.archive.process import ArchiveProcess
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LANE_CHOICES, LaneName
from skyfilter.delivery.redrive import redrive_dead_letters
from skyfilter.jobs import archive_without_spark
from skyfilter.jobs.job_config import add_common_arguments, job_main
from skyfilter.jobs.stream_job import StreamJob
from skyfilter.kafka.clients import act_as
from skyfilter.lanes.kafka_reachability import wait_until_reachable
from skyfilter.lanes.totals import StreamTotals, summary_lines
from skyfilter.local.arguments import config_from_args
from skyfilter.local.processes import start_time
from skyfilter.local.status import BUILDING, STARTING, write_starting
from skyfilter.plan.run_plan import RunPlan, fit_to_slots, settle_run, with_slots
from skyfilter.plan.slots import configured_master, local_cores
from skyfilter.plan.starting_offsets import starting_offsets
from skyfilter.plan.stream_files import StreamFiles, read_stream_files
from skyfilter.plan.stream_plan import build_plan, wait_for_schema
from skyfilter.schemas.reader import schema_name
from skyfilter.spark.session import get_spark

logger = logging.getLogger("skyfilter.jobs.filter_stream")  # the same name when run as __main__

ARCHIVE_START_S = 300.0  # how long the job waits for its archive process to run before saying it is running
LANE_ORDER = (LaneName.REALTIME, LaneName.DELIVERY, LaneName.ARCHIVE)  # as the start line names them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="filter_stream.py",
        description="Read alerts from Kafka, apply every SQL and Python filter in one pass, write each match "
                    "to its broker's topic (header 'filters' lists the filters it matched): the delivery lane. "
                    "Beside it, the archive lane writes every alert, match and per-batch metric to Delta tables "
                    "partitioned by night, exactly once, without ever delaying delivery.  SIGTERM or SIGINT (to "
                    "spark-submit or to this process) stops it cleanly: the batch under way finishes, the archive "
                    "catches up, the summary prints, exit 0; a second signal stops it at once.")
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
    parser.add_argument("--lane", choices=sorted(LANE_CHOICES), default="both",
                        help="run both lanes (default), or only one of them (e.g. the archive in its own process)")
    parser.add_argument("--archive-trigger", help="archive lane trigger, e.g. 10s (default: archive.trigger)")
    parser.add_argument("--stop-when-idle", type=float, metavar="SECONDS",
                        help="stop after this many seconds without new alerts, counted from the first alert "
                             "this run reads (a stream started before its night waits for it)")
    parser.add_argument("--wait-for-schema", type=float, default=None, metavar="SECONDS",
                        help="how long to wait for a producer to register the topic's schema "
                             "(default: forever, or 0 with --available-now)")
    parser.add_argument("--starting-offsets", metavar="auto|latest|earliest",
                        help="where a stream without a checkpoint starts: auto = the topic's end when the job "
                             "starts (everything with --available-now), latest, or earliest = all the topic holds "
                             "(default: stream.starting_offsets); a checkpoint always resumes where it was")
    parser.add_argument("--settled", metavar="FILE", help=argparse.SUPPRESS)  # an archive process: its parent's
    add_common_arguments(parser)
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> Config:
    """The config with the command-line flags applied on top (an archive process: the one its parent settled)."""
    if args.settled:
        return Config.saved(args.settled)
    cfg = config_from_args(args, {"stream.filters_dir": args.filters_dir, "stream.brokers": args.brokers,
                                  "stream.trigger": args.trigger, "topics.alerts": args.topic,
                                  "archive.trigger": args.archive_trigger,
                                  "stream.starting_offsets": args.starting_offsets})
    return act_as(cfg, "pipeline")


def session_for(cfg: Config, run_plan: RunPlan):
    """The SparkSession; a local master gets a task slot for every long-lived or archive task on top of its cores,
    so delivery keeps its cores' worth of slots free (``skyfilter/plan/slots.py``)."""
    app = f"skyfilter-filter-stream-{run_plan.name}"
    # An archive-only driver holds no delivery batches: it gets its own (smaller) heap.
    conf = {"spark.driver.memory": str(cfg.archive.driver_memory)} \
        if run_plan.lanes == LANE_CHOICES["archive"] and cfg.archive.driver_memory else None
    cores, need = local_cores(run_plan.master), run_plan.slots.total
    if cores is not None and need > cores:
        logger.info(f"task slots: Spark master {run_plan.master} -> local[{need}] ({cores} for delivery, the rest "
                    f"for Real-time Mode's long-lived tasks and the archive lane)")
        return get_spark(app, master=f"local[{need}]", conf=conf)
    return get_spark(app, conf=conf)


def run(args: argparse.Namespace, spark=None) -> StreamTotals:
    """Run the stream job until it is told to stop (or, with --available-now, until caught up)."""
    cfg = load_config(args)
    topic = cfg.topics.alerts
    name = args.name or topic
    files = None if args.lane == "archive" else stream_files(cfg)  # an archive alone may need none (delta-rs)
    run_plan, auto_line = settle_run(cfg, name, args.lane, args.available_now, configured_master(spark), files)
    if auto_line:
        logger.info(auto_line)
    wait_until_reachable(cfg, cfg.kafka.connect_wait_s)
    cfg = cfg.with_values({"stream.starting_offsets": starting_offsets(
        cfg, topic, cfg.checkpoint_dir / name, args.available_now, getattr(args, "launched_at", None))})
    archive_only = run_plan.lanes == LANE_CHOICES["archive"]
    status = write_starting(cfg, name, topic, STARTING, archive_only)
    try:
        wait = args.wait_for_schema if args.wait_for_schema is not None else (0 if args.available_now else 1e9)
        schema = wait_for_schema(cfg, topic, wait)
        if schema is None:
            logger.info(f"nothing to do: no schema is registered for topic '{topic}' (nothing was produced to it)")
            return StreamTotals()
        write_starting(cfg, name, topic, BUILDING, archive_only)
        if archive_only and run_plan.archive_writer == "delta-rs":
            return archive_without_spark.run(cfg, name, schema[1], args.available_now)
        return _run_lanes(args, cfg, run_plan, files, schema, spark)
    finally:
        status.unlink(missing_ok=True)


def stream_files(cfg: Config) -> StreamFiles:
    """The filter and broker files this run reads, once."""
    return read_stream_files(cfg.path("stream.filters_dir"), cfg.path("stream.brokers"))


def _run_lanes(args: argparse.Namespace, cfg: Config, run_plan: RunPlan, files: StreamFiles | None,
               schema: tuple[int, str], spark) -> StreamTotals:
    """Build the plan, start the lanes and run them until the job is told to stop."""
    topic, name = run_plan.topic, run_plan.name
    run_plan = with_slots(run_plan, cfg)  # a local master's cores are known now, a cluster's once Spark runs
    spark = spark or session_for(cfg, run_plan)
    cores = int(spark.sparkContext.defaultParallelism)
    run_plan, fitted = fit_to_slots(run_plan if run_plan.local_master else with_slots(run_plan, cfg, cores),
                                    cfg, cores)
    if fitted:
        logger.info(fitted)
    plan = build_plan(spark, cfg, topic, name, files or stream_files(cfg), schema)
    for problem in plan.problems:
        logger.warning(f"filter problem: {problem}")
    logger.info(f"stream '{name}': topic '{topic}' (schema id {plan.schema_id}, {plan.columns.family}), "
                f"{len(plan.filters)} filter(s) enabled for {len(plan.brokers)} broker(s)")
    if len(plan.inputs.known) > 1 or plan.inputs.pinned:
        reader = f"the pinned reader {schema_name(plan.inputs.reader)}" if plan.inputs.pinned else \
            f"schema id {plan.schema_id} ({schema_name(plan.inputs.reader)}), widened"
        logger.info(f"input schema versions: ids {', '.join(map(str, plan.inputs.readable))} read as {reader}"
                    + "".join(f"; dead-lettered: {reason}" for reason in plan.inputs.unreadable.values()))
    if LaneName.DELIVERY in run_plan.lanes:
        redrive_dead_letters(cfg, topic, plan.inputs, plan.checkpoint)
    job = StreamJob(spark, cfg, run_plan, plan)
    try:
        if run_plan.archive_apart:
            archive = ArchiveProcess(archive_arguments(cfg, run_plan), cfg.archive.nice, job.totals,
                                     cfg.run_dir / f"filter_stream.{name}.archive.log", cfg.archive.cpu_group)
            logger.info(f"archive lane: a process of its own, at a lower CPU priority: {archive.priority}")
            job.watch_archive_process(archive.start())
        job.start()
        running = ", ".join(f"{lane} (trigger {_label(job, lane)})" for lane in LANE_ORDER
                            if lane in job.queries or (lane == LaneName.ARCHIVE and job.archive is not None))
        if run_plan.archive_apart:
            if not job.archive_process.wait_until_running(ARCHIVE_START_S, lambda: job.signals.received
                                                       or job.kafka.over_limit() is not None):
                logger.warning(f"archive lane (process {job.archive_process.pid}) not running yet: delivery goes on, "
                               f"the archive catches up once it runs")
            running += f", archive (trigger {run_plan.triggers.archive}, process {job.archive_process.pid})"
        logger.info(f"stream '{name}' running: {running}; master {spark.sparkContext.master}, "
                    f"checkpoints {plan.checkpoint}")
        if args.available_now:
            job.run_available_now()
        else:
            job.wait(args.stop_when_idle)
        if job.archive_unfinished:
            process = job.archive_process
            raise SkyfilterError(
                f"stream '{name}': delivery stopped cleanly, but the archive lane (process {process.pid}) ended "
                f"before archiving everything delivered ({process.last_error or 'see ' + str(process.errors_to)}); "
                f"the next start archives the rest from its checkpoints")
    finally:
        job.stop()
        job.close()
    return job.totals


def archive_arguments(cfg: Config, run_plan: RunPlan) -> list[str]:
    """The command-line arguments of this job's archive lane run as a process of its own: the config this run
    settled (its stream, files, settings, starting offsets and archive writer), saved where the process reads
    it, with the archive lane in that process's driver and its metrics at ``monitoring.archive_port`` (the
    parent serves the lanes' lag)."""
    port = cfg.monitoring.archive_port if cfg.monitoring.port is not None else None  # off with the stream's
    settled = cfg.with_values({"monitoring.port": port, "archive.process": "same",
                               "archive.writer": run_plan.archive_writer})
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    saved = settled.save(cfg.run_dir / f"filter_stream.{run_plan.name}.archive.settled.json")
    return ["--lane", "archive", "--name", run_plan.name, "--wait-for-schema", "600", "--settled", str(saved)]


def _label(job: StreamJob, lane: LaneName) -> str:
    triggers = job.run_plan.triggers
    return {LaneName.REALTIME: f"realtime {triggers.realtime_interval}",
            LaneName.DELIVERY: job.delivery.trigger if job.delivery else "-", LaneName.ARCHIVE: triggers.archive}[lane]


def launch_time() -> float:
    """When the operator launched this job: the start of spark-submit's JVM when it runs this process, else of
    this process (``--starting-offsets auto`` reads what was produced from then on)."""
    import psutil

    parent = psutil.Process().parent()
    return start_time(parent.pid if parent is not None and parent.name().startswith("java") else os.getpid())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.launched_at = launch_time()

    def work() -> None:
        for line in summary_lines(run(args)):
            logger.info(line)

    return job_main("filter_stream", work, stop_is_clean=True)


if __name__ == "__main__":
    sys.exit(main())
