"""The `skyfilter` command: local Kafka, producers, the demo, the benchmarks.

Each subcommand lives in a module of :mod:`skyfilter.commands` that registers
its own parser.  Every subcommand takes ``--config`` (default conf/local.yaml)
and ``--set key=value`` overrides; errors print as one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys

from skyfilter.commands import bench, consume, demo, filters, kafka, produce, registry, spark, status, watch
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.log import log_to_console

DESCRIPTION = """skyfilter: the streaming filter stage of an astronomical alert stream.

Producers publish Avro alerts to Kafka; the Spark job pipelines/filter_stream.py
applies SQL and Python filters and fans matches out to per-broker topics,
archiving every night to Delta tables."""

COMMANDS = (kafka, spark, status, registry, consume, produce, filters, watch, demo, bench)  # in --help's order


def build_parser() -> argparse.ArgumentParser:
    """The `skyfilter` parser, each subcommand registered by its module."""
    parser = argparse.ArgumentParser(prog="skyfilter", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `skyfilter` console script."""
    args = build_parser().parse_args(argv)
    log_to_console()
    try:
        return args.run(args)
    except SkyfilterError as exc:
        print(f"skyfilter {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"skyfilter {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
