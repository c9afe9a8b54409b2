"""Command-line options every Spark job shares, and the config they produce."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from skyfilter.core.errors import SkyfilterError
from skyfilter.core.log import log_to_console
from skyfilter.local.arguments import add_config_arguments


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --set, --state-dir and --bootstrap: the same flags as the ``skyfilter`` commands."""
    add_config_arguments(parser, "where checkpoints and Delta tables live", bootstrap=True)


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived before the job had anything running to stop cleanly."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def job_main(prog: str, work: Callable[[], object], stop_is_clean: bool = False) -> int:
    """Run a job; a SkyfilterError becomes one line on stderr and exit code 2.

    SIGTERM/SIGINT end it with one line: exit 0 when ``stop_is_clean`` (a stream
    that has not started reading loses nothing: it takes its own signals once it
    runs), else 128 + the signal's number, as a shell reports it.
    """
    def stop(signum, _frame):
        raise StopRequested(signum)

    log_to_console()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        work()
    except SkyfilterError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except StopRequested as stopped:
        print(f"{prog}: stopped by {stopped}" + (" before the stream started reading" if stop_is_clean else ""),
              file=sys.stderr)
        return 0 if stop_is_clean else 128 + stopped.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
