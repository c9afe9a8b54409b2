"""How many task slots each lane of a stream job gets, so that a delivery batch never waits for one.

Spark runs a task per free slot and never preempts one.  The lanes therefore
get slots of their own rather than compete for them:

* Real-time Mode holds one long-lived task per input partition;
* the archive lane's queries run in ``archive.tasks`` task(s) plus one for the
  delivery-log query, whatever their batch size;
* micro-batch delivery gets the rest: ``stream.tasks``, or by default the
  cores the configured master names (``local[2]``: 2).

On a local master the job asks Spark for the sum (``local[2]`` with the archive
beside delivery becomes ``local[4]``); the threads of the archive and of
Real-time Mode mostly wait (on Kafka, on their trigger), so more threads than
cores is what lets delivery start at once.  On a cluster the executors' cores
are what they are: delivery gets what the other lanes leave.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError

DEFAULTS_MASTER = re.compile(r"^\s*spark\.master\s*[=:\s]\s*(\S+)")  # a Java properties line


@dataclass(frozen=True)
class Slots:
    """Task slots per lane of one stream job."""

    delivery: int   # tasks of a micro-batch delivery batch (0: no micro-batch delivery)
    realtime: int   # long-lived Real-time Mode tasks (one per input partition; 0: not in Real-time Mode)
    archive: int    # tasks of the archive lane's batches (0: no archive lane)
    archive_log: int  # tasks of the delivery-log query's batches

    @property
    def total(self) -> int:
        return self.delivery + self.realtime + self.archive + self.archive_log

    @property
    def realtime_need(self) -> int:
        """The slots a job with Real-time Mode needs at once: its long-lived tasks, the archive's, and one for
        micro-batch delivery when some brokers are left to it."""
        return self.realtime + self.archive + self.archive_log + min(self.delivery, 1)


def local_cores(master: str) -> int | None:
    """The N of ``local[N]`` (``local``: 1, ``local[*]``: this machine's cores); None for a cluster master."""
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if not match:
        return None
    return (os.cpu_count() or 1) if match[1] == "*" else int(match[1])


def configured_master(spark=None) -> str:
    """The master Spark runs this job on: ``spark``'s (a running session); under spark-submit its ``--master``;
    else the ``spark.master`` of the spark-defaults.conf a session started from Python reads; else Spark's own
    default, ``local[*]``.  Known before the session starts, so the run is settled once, for that master."""
    if spark is not None:
        return spark.sparkContext.master
    from skyfilter.spark.internals import submitted_master

    return submitted_master() or defaults_master() or "local[*]"


def defaults_master() -> str | None:
    """``spark.master`` of Spark's defaults file (``$SPARK_CONF_DIR``, else the conf folder of Spark's home)."""
    from skyfilter.local.spark_cluster import spark_home

    folder = os.environ.get("SPARK_CONF_DIR") or str(spark_home() / "conf")
    try:
        lines = (Path(folder) / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return None
    found = [match.group(1) for match in map(DEFAULTS_MASTER.match, lines) if match]
    return found[-1] if found else None


def plan_slots(cfg: Config, cores: int, realtime_partitions: int, micro_batches: bool, archive: bool) -> Slots:
    """The slots of each lane, delivery getting ``stream.tasks`` or else ``cores``."""
    wanted = cfg.stream.tasks
    delivery = (cores if wanted in (None, "auto") else int(wanted)) if micro_batches else 0
    archive_tasks = max(1, cfg.archive.tasks) if archive else 0
    return Slots(max(delivery, 1) if micro_batches else 0, realtime_partitions, archive_tasks, 1 if archive else 0)


def delivery_tasks(cfg: Config, available: int, slots: Slots) -> int:
    """Tasks per micro-batch delivery batch in a session of ``available`` slots: what the other lanes leave
    (at most ``slots.delivery``), at least one."""
    return max(1, min(slots.delivery, available - slots.realtime - slots.archive - slots.archive_log))


def check_realtime_slots(available: int, slots: Slots, topic: str) -> None:
    """One line when Spark has too few slots for Real-time Mode's long-lived tasks and the other lanes."""
    need = slots.realtime_need
    if available < need:
        raise SkyfilterError(
            f"Real-time Mode runs one long-lived task per input partition: topic '{topic}' has {slots.realtime}, "
            f"so this stream needs {need} task slots and Spark has {available}; start it with "
            f"--master local[{need}] (or more executor cores on a cluster)")
