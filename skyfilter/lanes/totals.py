"""Running totals of one run of the stream job, for its closing summary and its status file."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from skyfilter.core.figures import DeliveryFigures

# the lines the archive's writers print per batch (the Spark lanes and the delta-rs writers alike)
ARCHIVE_LINE = re.compile(r"^archive batch (?P<batch>\d+): (?P<archived>\d+) alerts archived, "
                          r"(?P<rejected>\d+) rejected")
LOG_LINE = re.compile(r"^archive log batch (?P<batch>\d+): (?P<matches>\d+) matches")


@dataclass
class StreamTotals:
    """What the lanes of this run did so far (updated from each lane's thread, under ``lock``)."""

    batches: int = 0          # delivery batches (micro-batch and realtime) with alerts
    archive_batches: int = 0
    input_alerts: int = 0
    rejected: int = 0
    archived: int = 0
    matches_logged: int = 0   # match records the archive lane has stored from the delivery log
    matches_by_broker: Counter = field(default_factory=Counter)
    matches_by_filter: Counter = field(default_factory=Counter)
    dropped_by_cap: Counter = field(default_factory=Counter)
    last_input_at: float = 0.0
    delivery_started: float | None = None   # wall clock of the first delivery batch with alerts
    delivery_finished: float | None = None  # and of the end of the last one
    delivery_busy_s: float = 0.0            # summed time of the delivery batches with alerts
    after_checkpoint: int = 0  # alerts Real-time Mode read after its last checkpoint: delivered, not yet counted
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_delivery(self, stats: DeliveryFigures, started: float, finished: float) -> None:
        """Count one delivery batch."""
        with self.lock:
            if stats.input_alerts:
                self.delivery_started = min(self.delivery_started or started, started)
                self.delivery_finished = max(self.delivery_finished or finished, finished)
                self.delivery_busy_s += finished - started
            self.batches += 1
            self.input_alerts += stats.input_alerts
            self.rejected += stats.rejected
            self.matches_by_broker.update(stats.by_broker)
            self.matches_by_filter.update(stats.by_filter)
            self.dropped_by_cap.update(stats.dropped_by_broker)
            if stats.input_alerts:
                self.last_input_at = max(self.last_input_at, finished)

    def add_archive(self, archived: int, finished: float) -> None:
        """Count one archive batch."""
        with self.lock:
            self.archive_batches += 1
            self.archived += archived
            if archived:
                self.last_input_at = max(self.last_input_at, finished)

    def count_line(self, line: str) -> None:
        """Count an archive writer's batch from the line it printed (a writer in a process of its own, or one that
        reports only by its lines)."""
        if batch := ARCHIVE_LINE.match(line):
            self.add_archive(int(batch["archived"]), time.time())
        elif batch := LOG_LINE.match(line):
            self.add_logged(int(batch["matches"]))

    def add_logged(self, matches: int) -> None:
        """Count the match records of one batch of the archive lane's delivery-log query."""
        with self.lock:
            self.matches_logged += matches

    def as_dict(self) -> dict:
        """The figures of the status file."""
        return {"input_alerts": self.input_alerts, "archived": self.archived, "matches_logged": self.matches_logged,
                "dead_letters": self.rejected,
                "matches": sum(self.matches_by_broker.values()), "by_broker": dict(self.matches_by_broker)}


def summary_lines(totals: StreamTotals) -> list[str]:
    """The closing summary of a run."""
    lines = [f"{totals.batches} delivery batch(es), {totals.archive_batches} archive batch(es): "
             f"{totals.input_alerts} alerts in, {totals.archived} archived, {totals.rejected} rejected"]
    lines += [f"  filter {name}: {count} matches" for name, count in sorted(totals.matches_by_filter.items())]
    lines += [f"  broker {name}: {count} alerts" + (f" ({totals.dropped_by_cap[name]} more over max_alerts_per_visit)"
                                                    if totals.dropped_by_cap[name] else "")
              for name, count in sorted(totals.matches_by_broker.items())]
    if totals.after_checkpoint:
        lines.append(f"  Real-time Mode counts at its checkpoints: the {totals.after_checkpoint} alert(s) it read "
                     f"after its last one were delivered but are not in these figures; its next start reads them "
                     f"again")
    return lines
