"""Resident memory of process trees, sampled in the background: the demo's and the benchmarks' peak RSS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from skyfilter.local.processes import command_line


def own_rss_mb() -> float:
    """Peak resident memory of this process alone (MB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_by_parent() -> dict[int, list[int]]:
    """Every running process's children, by parent pid (one pass over the process table)."""
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"], []).append(process.pid)
    return children


def process_tree_rss(pid: int, children: dict[int, list[int]] | None = None) -> dict[int, tuple[str, float]]:
    """Resident memory (MB) of a process and each of its descendants, by pid, with a short label.

    ``children`` is a :func:`children_by_parent` scan to reuse (one is made if absent).

    Forked workers (pyspark's) share pages with their parent, so the sum
    over-counts a little: it is an upper bound, which is what a budget needs.
    A JVM's child that still runs the JVM's own command line is left out: it
    is a ``posix_spawn`` in progress (Hadoop runs ``chmod`` and ``readlink``
    this way on every Delta write) and shares the JVM's memory until it execs,
    so counting it would count the whole JVM twice.
    """
    children = children_by_parent() if children is None else children
    found, todo = {}, [(pid, None)]
    while todo:
        current, parent_argv = todo.pop()
        argv = command_line(current)
        if spawning_copy(argv, parent_argv):
            continue
        todo += [(child, argv) for child in children.get(current, [])]
        try:
            found[current] = (process_label(argv), psutil.Process(current).memory_info().rss / 2**20)
        except psutil.Error:
            pass
    return found


def spawning_copy(argv: list[str], parent_argv: list[str] | None) -> bool:
    """Whether a process is a JVM's child that has not yet exec'd its new program (and shares the JVM's memory)."""
    return bool(argv) and argv == parent_argv and Path(argv[0]).name == "java"


def process_label(argv: list[str]) -> str:
    """A short name for a process: its program, or the Python module or script it runs."""
    if not argv or not argv[0]:
        return "?"
    program = Path(argv[0]).name
    if program.startswith("python"):
        if "-m" in argv[:-1]:
            return argv[argv.index("-m") + 1]
        scripts = [Path(a).name for a in argv[1:] if a.endswith(".py")]
        return scripts[0] if scripts else program
    return program


def breakdown(processes: dict[int, tuple[str, float]]) -> str:
    """'java 3,812 MB, 6 x pyspark.daemon 610 MB, ...': processes grouped by label, largest first."""
    groups: dict[str, list[float]] = {}
    for label, mb in processes.values():
        groups.setdefault(label, []).append(mb)
    parts = sorted(groups.items(), key=lambda item: -sum(item[1]))
    return ", ".join(f"{'' if len(mbs) == 1 else f'{len(mbs)} x '}{label} {sum(mbs):,.0f} MB" for label, mbs in parts)


class RssSampler:
    """Samples the RSS of named process trees every ``interval_s`` seconds in a background thread."""

    def __init__(self, pids: dict[str, Callable[[], int | None]], interval_s: float = 0.5):
        self.pids = pids
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._peak_processes: dict[str, dict[int, tuple[str, float]]] = {}
        self._highest_total = -1.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.began = time.time()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            reading, processes, children = {}, {}, children_by_parent()
            for name, pid in self.pids.items():
                current = pid()
                processes[name] = process_tree_rss(current, children) if current else {}
                reading[name] = sum(mb for _, mb in processes[name].values())
            if sum(reading.values()) > self._highest_total:
                self._highest_total, self._peak_processes = sum(reading.values()), processes
            self.samples.append((time.time() - self.began, reading))
            if self._stop.wait(self.interval_s):
                return

    def peak(self, name: str) -> float:
        """The highest RSS seen for ``name`` (MB)."""
        return max((reading[name] for _, reading in self.samples), default=0.0)

    def peaks(self) -> dict[str, float]:
        """The highest RSS seen for every name (MB)."""
        return {name: self.peak(name) for name in self.pids}

    def peak_total(self) -> float:
        """The highest sum of all the named trees within one sample (MB)."""
        return max(self._highest_total, 0.0)

    def peak_breakdown(self) -> str:
        """The processes behind :meth:`peak_total`, grouped by label per named tree."""
        return "; ".join(f"{name}: {breakdown(processes)}" for name, processes in self._peak_processes.items()
                         if processes)
