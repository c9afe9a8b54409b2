"""CPU time per part of a benchmark run: the delivery driver, the archive process, Kafka, a local Spark
cluster's daemons and executors (when the run uses one), the rest.

On two cores the lanes, the producer and Kafka share the machine, so where its
CPU goes says why a latency target is missed.  Read with psutil (the CPU times
of live processes, and the machine's busy time for what exited, such as
producer processes).
"""

from __future__ import annotations

import psutil

from skyfilter.local.memory import children_by_parent
from skyfilter.local.processes import command_line

ARCHIVE_MARK = "--lane"  # the archive child: ``python -m skyfilter.jobs.filter_stream ... --lane archive``


def cpu_now(driver_pid: int, kafka_pid: int | None, cluster_pids: tuple[int, ...] = ()) -> dict[str, float]:
    """CPU seconds used so far by each part: ``archive`` (the archive process tree), ``driver`` (the benchmark's
    own tree without it and without the producer processes: the Spark driver, its Python workers), ``kafka``,
    ``cluster`` (the trees of a standalone cluster's master and workers: its executors and their filter workers),
    and ``machine`` (every process)."""
    children = children_by_parent()
    cluster = {pid for root in cluster_pids for pid in _tree(root, children)}
    archive = [pid for pid in _tree(driver_pid, children) if _is_archive(pid)]
    archive_tree = {pid for root in archive for pid in _tree(root, children)}
    producers = {pid for root in _tree(driver_pid, children) if _is_producer(root) for pid in _tree(root, children)}
    kafka = set(_tree(kafka_pid, children)) if kafka_pid else set()  # the benchmark may have started it
    driver_tree = set(_tree(driver_pid, children)) - archive_tree - producers - kafka
    return {"driver": sum(map(_cpu, driver_tree)), "archive": sum(map(_cpu, archive_tree)),
            "kafka": sum(map(_cpu, kafka)), "cluster": sum(map(_cpu, cluster)), "machine": _machine()}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Core-seconds per part between two :func:`cpu_now` readings; ``other`` is what the machine used besides
    them (the producer processes, the operating system)."""
    used = {part: round(after[part] - before[part], 1) for part in before}
    used["other"] = round(used["machine"] - used["driver"] - used["archive"] - used["kafka"] - used["cluster"], 1)
    return used


def _tree(root: int, children: dict[int, list[int]]) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _is_producer(pid: int) -> bool:
    """A producer process of the benchmark (``skyfilter/producers/produce.py`` spawns them): counted with the
    rest of the machine, not as the delivery driver."""
    return any("multiprocessing.spawn" in part for part in command_line(pid))


def _is_archive(pid: int) -> bool:
    argv = command_line(pid)
    return ARCHIVE_MARK in argv and argv[argv.index(ARCHIVE_MARK) + 1:][:1] == ["archive"]


def _cpu(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def _machine() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal
