"""``skyfilter spark``: start or stop a Spark standalone cluster on this machine."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter spark`` to the command's parser."""
    spark = commands.add_parser(
        "spark", help="start or stop a Spark standalone cluster on this machine",
        description="Run a Spark standalone master and workers from the installed pyspark (loopback only; "
                    "logs under <state_dir>/spark).  Then submit the unchanged job to it:\n"
                    "  spark-submit --master spark://127.0.0.1:7077 pipelines/filter_stream.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    spark.add_argument("action", choices=["start-cluster", "stop-cluster", "status"])
    spark.add_argument("--workers", type=int, help="start-cluster: number of workers (default: spark_cluster.workers)")
    add_config_arguments(spark, "where daemon logs and work folders live")
    spark.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter spark``; errors raise :class:`SkyfilterError`."""
    from skyfilter.local.spark_cluster import SparkStandalone

    cfg = config_from_args(args)
    cluster = SparkStandalone(cfg, args.workers)
    if args.action == "start-cluster":
        url = cluster.start()
        print(cluster.summary())
        print(f"submit the stream job with: spark-submit --master {url} pipelines/filter_stream.py [options]")
    elif args.action == "stop-cluster":
        stopped = cluster.stop()
        pids = f" (pids {', '.join(map(str, stopped))})" if stopped else ""
        print(f"stopped {len(stopped)} Spark daemon(s){pids}")
    else:
        print(cluster.summary())
    return 0
