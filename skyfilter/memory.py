"""Resident memory of process trees, sampled in the background: the demo's and the benchmarks' peak RSS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path


def own_rss_mb() -> float:
    """Peak resident memory of this process alone (MB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (MB); 0 once it is gone."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total_kb, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            pass
    return total_kb / 1024


class RssSampler:
    """Samples the RSS of named process trees every ``interval_s`` seconds in a background thread."""

    def __init__(self, pids: dict[str, Callable[[], int | None]], interval_s: float = 0.5):
        self.pids = pids
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
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
            reading = {}
            for name, pid in self.pids.items():
                current = pid()
                reading[name] = process_tree_rss_mb(current) if current else 0.0
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
        return max((sum(reading.values()) for _, reading in self.samples), default=0.0)
