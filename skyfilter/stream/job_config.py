"""Command-line options every Spark job shares, and the config they produce."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from skyfilter.core.config import add_config_arguments
from skyfilter.core.errors import SkyfilterError


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --set, --state-dir and --bootstrap: the same flags as the ``skyfilter`` commands."""
    add_config_arguments(parser, "where checkpoints and Delta tables live", bootstrap=True)


def job_main(prog: str, work: Callable[[], object]) -> int:
    """Run a job; a SkyfilterError becomes one line on stderr and exit code 2."""
    try:
        work()
    except SkyfilterError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0
