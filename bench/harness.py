"""What every benchmark needs around its measurement: a Kafka to run against, memory samples, a main()."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every benchmark has: cutouts, where results and state go, which Kafka, quiet."""
    parser.add_argument("--stamps", action=argparse.BooleanOptionalAction, default=True,
                        help="alerts carry their three FITS cutouts, Rubin size (default yes)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="results folder")
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".local" / "bench",
                        help="Kafka data, checkpoints and Delta tables of the benchmark (default .local/bench)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting a local one")
    parser.add_argument("--runs-table", type=Path,
                        help="bench_runs Delta table every run is appended to (default <state-dir>/bench_runs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_stream_arguments(parser: argparse.ArgumentParser,
                         settings: str = "a config setting of the streams, e.g. --set archive.process=same") -> None:
    """``--archive-trigger``, ``--log-trigger`` (the triggers of the archive lane's two queries: a benchmark
    waits until both have taken in every alert, and a test on tiny inputs shortens them) and ``--set``."""
    parser.add_argument("--archive-trigger", default=None, help="archive lane trigger (default: the config's)")
    parser.add_argument("--log-trigger", default=None,
                        help="trigger of the archive's delivery-log query (default: the config's archive.log_trigger)")
    add_settings_argument(parser, settings)


def add_settings_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--set KEY=VALUE`` (repeatable, into ``sets``): config settings of the benchmark's streams."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[], dest="sets",
                        help=f"{what} (repeatable)")


def add_warm_up_flag(parser: argparse.ArgumentParser, first_run: str) -> None:
    """``--warm-up/--no-warm-up``: whether ``first_run`` goes first, unmeasured, so the first measured run
    does not pay for a cold driver (JIT compilation, Python worker start-up)."""
    parser.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help=f"first run {first_run}, unmeasured, so the first measurement does not pay for a "
                             "cold driver (JIT, Python workers); default yes")


def bench_spark(cfg, app: str, trigger: str = "0", partitions: int = 8):
    """The benchmark's SparkSession with the task slots the stream's lanes need (``skyfilter/plan/slots.py``).

    As ``filter_stream.py`` asks for them: the configured cores for micro-batch
    delivery, one slot per input partition in Real-time Mode, and the archive
    lane's own when it runs in this process (``archive.process``).  A running
    session with enough slots is reused; one with too few is stopped first (the driver JVM stays).
    """
    from pyspark.sql import SparkSession

    from skyfilter.core.lane_names import LANE_CHOICES
    from skyfilter.plan.run_plan import archive_apart
    from skyfilter.plan.slots import configured_master, local_cores, plan_slots
    from skyfilter.spark.internals import active_context
    from skyfilter.spark.session import get_spark

    cores = local_cores(configured_master()) or 2
    archive_here = not archive_apart(cfg, LANE_CHOICES["both"], False, True)
    slots = plan_slots(cfg, cores, partitions if trigger == "realtime" else 0, True, archive_here)
    master = f"local[{slots.total}]"
    context = active_context()  # not per thread, unlike the active session
    if context is not None and (local_cores(context.master) or 0) < slots.total:
        (SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()).stop()
    return get_spark(app, master=master)


def bench_schema(cfg) -> dict:
    """The Rubin schema of the benchmarks' simulated alerts: ``bench.schema_version`` (set by bench_kafka; every
    published figure used 10.0, so comparisons across rounds stay on the same alerts)."""
    from skyfilter.schemas.avro import rubin_schema

    return rubin_schema(cfg.simulation.schema_version)


def runs_table(args: argparse.Namespace) -> Path:
    """Where this run is recorded: ``--runs-table`` or ``<state-dir>/bench_runs``."""
    return args.runs_table or args.state_dir / "bench_runs"


def settings_of(args: argparse.Namespace) -> dict:
    """The run's options as JSON-friendly values, for the results file."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def spark_driver_pid(spark) -> int | None:
    """Pid of the local Spark driver JVM (which also runs the executor and forks the Python workers)."""
    from skyfilter.spark.internals import driver_jvm_pid

    return driver_jvm_pid(spark)


def driver_and_kafka(spark, cluster, interval_s: float = 0.5):
    """A memory sampler of the benchmark's Spark driver tree and of its own Kafka node (0 for another Kafka)."""
    from skyfilter.local.memory import RssSampler

    return RssSampler({"driver": lambda: spark_driver_pid(spark), "kafka": kafka_pid(cluster)}, interval_s)


def kafka_pid(cluster) -> Callable[[], int | None]:
    """A callable giving the pid of the benchmark's own Kafka node (None when it uses another Kafka)."""
    return (lambda: cluster.nodes[0].pid()) if cluster is not None else (lambda: None)


# What a run leaves in its state folder besides the cache and bench_runs; removed when the next run starts.
RUN_STATE = ("kafka", "delta", "checkpoints", "filter_sets", "run")


@contextmanager
def bench_kafka(state_dir: Path, bootstrap: str | None, heap: str = "1g", sets: list[str] | None = None) -> Iterator:
    """A config whose Kafka is ``bootstrap``, or a fresh local single node started (and stopped) for the run.

    The previous run's Kafka data, tables and checkpoints are removed first (a
    full-size run leaves tens of GB); its results live on in the results folder
    and the ``bench_runs`` table, and the cached visits are kept, and so are the
    error logs of failed streams (moved to ``<state_dir>/errors``).
    """
    import shutil

    from skyfilter.core.config import Config, parse_overrides
    from skyfilter.core.errors import SkyfilterError
    from skyfilter.local.kafka import LocalKafka, free_port_pair

    cfg = Config.load(overrides=parse_overrides(sets))
    if state_dir.resolve() == cfg.state_dir.resolve():
        raise SkyfilterError(f"--state-dir {state_dir} is the project's own state folder; benchmarks clear "
                             f"their state folder between runs, so give them another one")
    cfg = cfg.with_values({"state_dir": str(state_dir),
                           "simulation.schema_version": cfg.bench.schema_version})  # see bench_schema
    LocalKafka(cfg).stop()
    for log in (state_dir / "run").glob("*.error.log"):
        (state_dir / "errors").mkdir(exist_ok=True)
        shutil.move(log, state_dir / "errors" / log.name)
    for name in RUN_STATE:
        shutil.rmtree(state_dir / name, ignore_errors=True)
    if bootstrap:
        cfg = cfg.with_values({"kafka.bootstrap_servers": bootstrap})
        yield cfg, None
        return
    cfg = cfg.with_values({"kafka.base_port": free_port_pair(29092), "kafka.heap": heap})
    cluster = LocalKafka(cfg)
    cfg = cfg.with_values({"kafka.bootstrap_servers": cluster.start()})
    try:
        yield cfg, cluster
    finally:
        cluster.stop()


def warm_kafka(cfg, cached: Path, schema: dict, seconds: float, producers: int = 1) -> None:
    """Send ``seconds`` of the cached visits (one a second) through a scratch topic and read them back.

    A benchmark starts its own Kafka; an operator's night starts on one that has run
    for weeks.  A fresh Kafka JVM spends its first minutes compiling its own request
    path (measured: 8.9 core-seconds of JIT in the 30 s after a stream's start, on 2
    cores): that is the broker's start, not the stream's, and it takes the cores the
    stream needs.  This serves Kafka the same produce and fetch traffic first.
    """
    from bench.alert_cache import CachedSource
    from skyfilter.kafka.read_back import read_topic
    from skyfilter.producers.command import send_source

    if seconds <= 0:
        return
    send_source(cfg, "bench.kafka-warm-up", CachedSource(cached, max(1, round(seconds)), schema), schema, 1.0,
                producers, progress=False, spread_s=0.95)
    read_topic(cfg, "bench.kafka-warm-up", timeout=60)


def bench_main(module: str, parse_args: Callable[[list[str] | None], argparse.Namespace],
               run: Callable[[argparse.Namespace], dict[str, Path]], argv: list[str] | None) -> int:
    """Parse, run, print the Markdown table and the result files; one error line and exit 2 on failure."""
    from bench.report import command_line
    from skyfilter.core.errors import SkyfilterError
    from skyfilter.core.log import console_level, log_to_console

    args = parse_args(argv)
    args.command = command_line(module, argv)
    log_to_console()
    try:
        with console_level(logging.WARNING):  # the stream's and producers' lines go to the log file only
            paths = run(args)
    except SkyfilterError as exc:
        print(f"{module.rsplit('.', 1)[-1]}: error: {exc}", file=sys.stderr)
        return 2
    print(paths["md"].read_text().split("\n\n")[1])
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    return 0
