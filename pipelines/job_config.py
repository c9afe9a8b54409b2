"""Command-line options every Spark job shares, and the config they produce."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from skyfilter.config import Config, parse_overrides
from skyfilter.errors import SkyfilterError


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: conf/local.yaml or $SKYFILTER_CONFIG)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: kafka.bootstrap_servers)")
    parser.add_argument("--state-dir", help="where checkpoints and Delta tables live (default: state_dir)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a config key (repeatable)")


def config_from_args(args: argparse.Namespace, flags: dict[str, object] | None = None) -> Config:
    """The config named by --config, with --set overrides and the job's own flags on top."""
    cfg = Config.load(args.config, parse_overrides(args.set))
    every = {"kafka.bootstrap_servers": args.bootstrap, "state_dir": args.state_dir, **(flags or {})}
    for key, value in every.items():
        if value is not None:
            cfg.set(key, value)
    return cfg


def job_main(prog: str, work: Callable[[], object]) -> int:
    """Run a job; a SkyfilterError becomes one line on stderr and exit code 2."""
    try:
        work()
    except SkyfilterError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0
