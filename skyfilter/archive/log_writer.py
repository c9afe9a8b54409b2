"""The archive's delivery-log query without Spark: the log to ``matches``, ``broker_visits``, ``metrics`` by delta-rs.

What the Spark log query does (``skyfilter/archive/log_lane.py``) with a
confluent-kafka consumer and no JVM.  Each batch window of the log is one
commit per table, carrying the next log offset of each partition it covers
(empty commits included, so every table's offsets keep up); a restart resumes
from the lowest of them and skips, per table, the records that table already
committed.  A delivery batch that was retried logs its records again: each
row is inserted once by its keys (:class:`KeyedAppends`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from skyfilter.archive.delta_appends import KeyedAppends, stored_offsets
from skyfilter.archive.log_rows import LOG_TABLES, table_rows
from skyfilter.archive.topic_batches import TopicBatches, next_offsets
from skyfilter.core.config import Config
from skyfilter.core.lane_names import LaneName
from skyfilter.lanes.monitoring import StreamMonitor

logger = logging.getLogger(__name__)

LANE = LaneName.ARCHIVE_LOG


class LogWriter(TopicBatches):
    """Reads a stream's delivery log and inserts its rows once into the log's tables."""

    def __init__(self, cfg: Config, name: str, log_topic: str, tables: dict[str, Path], trigger_s: float,
                 max_records: int, monitor: StreamMonitor | None = None, on_batch: Callable[[str], None] | None = None):
        super().__init__(cfg, log_topic, f"skyfilter-{name}-archive-log", trigger_s, max_records, monitor, on_batch)
        self.app_id = log_app_id(name)
        self.tables = [(table, KeyedAppends(tables[table.name], table)) for table in LOG_TABLES]
        self.kept: dict[str, dict[int, int]] = {}  # per table: the next log offset it holds, per partition

    def stored(self, partitions: list[int]) -> dict[int, int]:
        """The lowest next offset over the tables (a partition one of them holds nothing of is read again)."""
        self.kept = {table.name: stored_offsets(appends.path, self.app_id, self.topic, partitions, scan=False)
                     for table, appends in self.tables}
        return lowest(self.kept.values(), partitions)

    def write_batch(self, messages: list) -> None:
        started = time.time()
        records = [(m.partition(), m.offset(), _record(m.value()), m.timestamp()[1]) for m in messages]
        offsets = next_offsets(messages)
        first = {partition: offset for partition, offset, _, _ in reversed(records)}  # each partition's lowest
        whole = None  # every record's rows, made once when no table committed any of them (the common case)
        for table, appends in self.tables:
            kept = self.kept.get(table.name, {})
            if all(kept.get(partition, 0) <= offset for partition, offset in first.items()):
                whole = whole or table_rows([(record, timestamp) for _, _, record, timestamp in records])
                rows = whole[table.name]
            else:  # after a restart: leave out what this table committed before it
                rows = table_rows([(record, timestamp) for partition, offset, record, timestamp in records
                                   if offset >= kept.get(partition, 0)])[table.name]
            appends.insert(rows, self.app_id, offsets)
            self.kept[table.name] = kept | offsets
        finished = time.time()
        matches = sum(len(record.get("brokers") or []) for _, _, record, _ in records if record.get("kind") == "match")
        summaries = sum(1 for _, _, record, _ in records if record.get("kind") == "batch")
        if self.monitor is not None:
            self.monitor.observe_log(self.batches, len(records), started, finished)
        self.batch_done(f"archive log batch {self.batches}: {matches} matches, {summaries} batch records logged, "
                        f"done in {finished - started:.2f} s")


def _record(value: bytes | None) -> dict:
    """A log record, or an empty one if it is not JSON (left out of every table)."""
    try:
        record = json.loads(value or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def logged_offsets(tables: dict[str, Path], name: str, log_topic: str, partitions: list[int]) -> dict[int, int]:
    """The next offset of each delivery-log partition that every log table has committed."""
    return lowest([stored_offsets(tables[table.name], log_app_id(name), log_topic, partitions, scan=False)
                   for table in LOG_TABLES], partitions)


def lowest(stored, partitions: list[int]) -> dict[int, int]:
    """Per partition, the lowest of several tables' next offsets (left out where one of them holds none)."""
    stored = list(stored)
    return {p: min(kept[p] for kept in stored) for p in partitions if all(p in kept for kept in stored)}


def log_app_id(name: str) -> str:
    """The app transaction prefix a stream's log writer commits its log offsets under (as the Spark query's)."""
    return f"skyfilter:{name}:{LANE}"
