"""Hot reload: filter and broker file changes reach the running stream between two batches.

Before each batch the stream compares the size and modification time of the
filter files and the brokers file with what it last saw.  On a change it rebuilds the filters and
brokers against the same alert schema, creates the topics and schemas of new
brokers, swaps a new plan in, logs one line saying what changed, and runs the
batch with the new set.  A filter whose edit is broken keeps its previous version running (and
the reason is logged); a broken brokers file keeps the previous brokers.
Batches are never split or repeated by a reload, so no input alert is lost
or counted twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from skyfilter.core.brokers import BrokerSpec, load_brokers
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterProblem
from skyfilter.plan.outputs import prepare_outputs
from skyfilter.plan.stream_files import read_stream_files
from skyfilter.plan.stream_plan import PlanCell, StreamPlan, resolve_filters, template_frame
from skyfilter.watch.columns import Watch, load_watch, used_by
from skyfilter.watch.store import fingerprint as watch_fingerprint

logger = logging.getLogger(__name__)


def files_fingerprint(filters_dir: Path, brokers_file: Path) -> tuple:
    """Name, size and modification time (ns) of every filter file and of the brokers file.

    Taken before every batch, so it only stats the files; a change is read when it is seen.
    """
    paths = sorted(p for p in filters_dir.glob("*") if p.suffix in (".sql", ".py")) if filters_dir.is_dir() else []
    stamps = []
    for path in [*paths, brokers_file]:
        try:
            info = path.stat()
            stamps.append((str(path), info.st_size, info.st_mtime_ns))
        except FileNotFoundError:
            stamps.append((str(path), -1, 0))
    return tuple(stamps)


class PlanReloader:
    """Watches a running stream's filter and broker files and swaps a new plan in when they change."""

    def __init__(self, spark: SparkSession, cfg: Config, cell: PlanCell, filters_dir: Path, brokers_file: Path,
                 held_off=dict):
        self.spark = spark
        self.cfg = cfg
        self.cell = cell
        self.filters_dir = filters_dir
        self.brokers_file = brokers_file
        self.held_off = held_off  # () -> {filter name: digest} of quarantined filters, which a reload leaves off
        self.fingerprint = self._fingerprint()
        self.lock = threading.Lock()  # the micro-batch lane and, in Real-time Mode, the job's main loop check

    def check(self) -> bool:
        """Reload when the files changed since the last check; True when a reload ran."""
        with self.lock:
            fingerprint = self._fingerprint()
            if fingerprint == self.fingerprint:
                return False
            self.fingerprint = fingerprint
            self.reload()
            return True

    def _fingerprint(self) -> tuple:
        return files_fingerprint(self.filters_dir, self.brokers_file), watch_fingerprint(self.cfg)

    def reload(self) -> bool:
        """Build a plan with the filters and brokers of the files and swap it in; True when what runs changed."""
        plan = self.cell.current
        try:
            brokers = load_brokers(self.brokers_file)
        except SkyfilterError as exc:
            logger.info(f"reload: {exc}; the previous brokers stay in place")
            brokers = list(plan.brokers)
        files = read_stream_files(self.filters_dir, self.brokers_file, brokers)
        watch = load_watch(self.cfg)
        template, _ = template_frame(self.spark, self.cfg, plan.inputs, watch)
        previous = {spec.name: spec for spec in plan.filters}
        filters, brokers, problems = resolve_filters(template, files, previous)
        held = self.held_off()
        filters = [f for f in filters if held.get(f.name) != f.digest]
        running = {spec.name for spec in filters}
        brokers = [replace(b, enabled_filters=[f for f in b.enabled_filters if f in running]) for b in brokers]
        try:
            encodings = prepare_outputs(self.cfg, template, plan.inputs, plan.cutouts, brokers, filters)
        except SkyfilterError as exc:
            logger.info(f"reload: {exc}; keeping the previous filters and brokers")
            return False
        changes = "; ".join(c for c in (describe_changes(plan, filters, brokers),
                                        describe_watch(plan.watch, watch, used_by(filters))) if c)
        for problem in problems:
            kept = isinstance(problem, FilterProblem) and problem.path.stem in {f.name for f in filters}
            logger.warning(f"reload: {problem}" + ("; its previous version keeps running" if kept else ""))
        self.cell.update(lambda current: replace(current, filters=filters, brokers=brokers, encodings=encodings,
                                                 problems=problems, watch=watch, files=files))
        logger.info(f"reload: {changes or 'no change to the running filters or brokers'}")
        return bool(changes)


def describe_changes(plan: StreamPlan, filters: list, brokers: list[BrokerSpec]) -> str:
    """One line: the filters and brokers added, changed and removed."""
    before = {f.name: f.digest for f in plan.filters}
    after = {f.name: f.digest for f in filters}
    old_brokers = {b.name: b.delivery for b in plan.brokers}
    new_brokers = {b.name: b.delivery for b in brokers}
    parts = []
    for label, old, new in (("filter", before, after), ("broker", old_brokers, new_brokers)):
        for verb, names in (("added", sorted(set(new) - set(old))),
                            ("changed", sorted(n for n in set(new) & set(old) if new[n] != old[n])),
                            ("removed", sorted(set(old) - set(new)))):
            if names:
                parts.append(f"{label}(s) {verb}: {', '.join(names)}")
    return "; ".join(parts)


def describe_watch(before: Watch, after: Watch, used: set[tuple[str, str]]) -> str:
    """One phrase: the new versions of the lists and maps running filters use (removed ones too)."""
    old = {(v.kind, v.name): v for v in before.versions}
    new = {(v.kind, v.name): v for v in after.versions}
    parts = []
    for key in sorted(used):
        if key in new and (key not in old or old[key].version != new[key].version):
            parts.append(f"{key[0]} {key[1]} now version {new[key].version} ({new[key].rows:,} rows)")
    for key in sorted(set(old) - set(new)):
        parts.append(f"{key[0]} {key[1]} removed")
    return "; ".join(parts)

