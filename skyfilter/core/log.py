"""What skyfilter says while it works: Python's ``logging``, one console format, one log file.

Every module logs to its own logger under ``skyfilter`` (``logging.getLogger(__name__)``).
A command or job calls :func:`log_to_console` once: each line goes to standard output
as it is (what an operator reads and what ``skyfilter status``, the tests and the stream
job's parent read back), and, with its time, level and module, to the log file Spark's
JVM writes too (``.local/logs/spark-driver.log``), so one file holds both sides of a run.
Results a command prints (a table, a consumed message) are its output, not log lines:
they stay ``print``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skyfilter.core.versions import PROJECT_ROOT

ROOT_LOGGER = "skyfilter"
CONSOLE_FORMAT = "%(message)s"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the Spark log file's layout
FILE_DATES = "%Y-%m-%d %H:%M:%S"
LOG_FILE = PROJECT_ROOT / ".local" / "logs" / "spark-driver.log"  # Spark's JVM logs here too (its log4j2 config)

logging.getLogger(ROOT_LOGGER).setLevel(logging.INFO)  # INFO reaches any handler, pytest's capture included


class _Flushing(logging.StreamHandler):
    """A console handler that writes to whatever ``sys.stdout`` is now (a test harness swaps it, and may close
    the one it swapped out), each line flushed as it comes (a parent process reads them)."""

    def __init__(self):
        super().__init__(sys.stdout)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout  # not setStream: that flushes the previous stream, which may be closed
        super().emit(record)  # writes and flushes; a failure goes to handleError, never to the caller


def log_to_console(log_file: Path | None = None) -> None:
    """Send skyfilter's log lines to standard output, plain, and to ``log_file`` (default: the log file of
    Spark's JVM, when the project's state folder exists) with time, level and module.  Called once by each
    command and job; calling it again changes nothing."""
    root = logging.getLogger(ROOT_LOGGER)
    if any(getattr(handler, "skyfilter", False) for handler in root.handlers):
        return
    console = _Flushing()
    console.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    handlers: list[logging.Handler] = [console]
    log_file = log_file or _spark_log_file()
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            to_file = logging.FileHandler(log_file, encoding="utf-8")
        except OSError:
            to_file = None  # a read-only checkout still talks on the console
        if to_file is not None:
            to_file.setFormatter(logging.Formatter(FILE_FORMAT, FILE_DATES))
            handlers.append(to_file)
    for handler in handlers:
        handler.skyfilter = True
        root.addHandler(handler)
    root.propagate = False  # said once: not again by a handler a library gave the root logger


def _consoles() -> list[logging.Handler]:
    return [h for h in logging.getLogger(ROOT_LOGGER).handlers if isinstance(h, _Flushing)]


@contextmanager
def console_prefix(prefix: str) -> Iterator[None]:
    """Inside the block, console lines start with ``prefix`` (the demo indents what its steps say)."""
    consoles = _consoles()
    for console in consoles:
        console.setFormatter(logging.Formatter(prefix + CONSOLE_FORMAT))
    try:
        yield
    finally:
        for console in consoles:
            console.setFormatter(logging.Formatter(CONSOLE_FORMAT))


@contextmanager
def console_level(level: int) -> Iterator[None]:
    """Inside the block, the console shows only lines of ``level`` and above (the benchmarks print their own
    progress and tables); the log file still gets every line."""
    consoles = _consoles()
    before = [console.level for console in consoles]
    for console in consoles:
        console.setLevel(level)
    try:
        yield
    finally:
        for console, old in zip(consoles, before, strict=True):
            console.setLevel(old)


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def captured(into: list[str] | None = None) -> Iterator[list[str]]:
    """The lines skyfilter logs inside the block (any thread), as the console shows them, in a list that fills
    as they come (``into``, or a new one): a benchmark reads a stream's lines, a test checks what a job said."""
    lines = [] if into is None else into
    handler = _Lines(lines)
    root = logging.getLogger(ROOT_LOGGER)
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)


def _spark_log_file() -> Path | None:
    return LOG_FILE if LOG_FILE.parent.parent.is_dir() else None
