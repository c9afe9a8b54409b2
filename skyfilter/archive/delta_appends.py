"""Appends to the archive's Delta tables without Spark (delta-rs), each carrying the Kafka offsets it holds.

Exactly once without a checkpoint: every commit records, as Delta *app
transactions* (the same mechanism as Spark's ``txnAppId``/``txnVersion``),
the next offset of each input partition it covers, atomically with its rows.
A writer that starts again reads those versions and resumes from them, so a
crash between reading and committing re-reads what was not committed and
nothing that was.  Spark reads the tables, their history and time travel as
it reads its own (protocol 1/2, the same schema).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from skyfilter.archive.log_rows import LogTable

# the raw layout of ``alerts`` (skyfilter/archive/layout.py), typed as Spark types it
ALERTS_SCHEMA = pa.schema([
    ("kafka_topic", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
    ("kafka_timestamp", pa.timestamp("us", tz="UTC")), ("kafka_key", pa.binary()), ("kafka_value", pa.binary()),
    ("night", pa.string()), ("visit_id", pa.int64()), ("alert_id", pa.string()), ("schema_id", pa.int64())])
REJECTS_SCHEMA = pa.schema([
    ("kafka_topic", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
    ("kafka_timestamp", pa.timestamp("us", tz="UTC")), ("kafka_key", pa.binary()), ("kafka_value", pa.binary()),
    ("schema_id", pa.int64()), ("reject_reason", pa.string()), ("batch_id", pa.int64())])
SCHEMAS_SCHEMA = pa.schema([("schema_id", pa.int64()), ("schema_json", pa.string())])


def partition_app_id(app_id: str, partition: int) -> str:
    """The app transaction id under which a table keeps the next offset of one input partition."""
    return f"{app_id}:partition-{partition}"


def exists(path: Path) -> bool:
    """Whether a Delta table with at least one commit is at ``path``."""
    return DeltaTable.is_deltatable(str(path))


def stored_offsets(path: Path, app_id: str, topic: str, partitions: list[int], scan: bool = True) -> dict[int, int]:
    """The next offset of each input partition a table holds: its app transactions, or (``scan``, for a table an
    earlier writer filled without them) one past the highest offset of the partition in it.  Partitions it holds
    nothing of are left out."""
    if not exists(path):
        return {}
    table = DeltaTable(str(path))
    found = {p: v for p in partitions if (v := table.transaction_version(partition_app_id(app_id, p))) is not None}
    missing = [p for p in partitions if p not in found]
    if missing and scan:
        rows = table.to_pyarrow_dataset().to_table(
            columns=["kafka_partition", "kafka_offset"],
            filter=(pc.field("kafka_topic") == topic) & pc.field("kafka_partition").isin(missing))
        for group in rows.group_by("kafka_partition").aggregate([("kafka_offset", "max")]).to_pylist():
            found[group["kafka_partition"]] = group["kafka_offset_max"] + 1
    return found


def append_once(path: Path, rows: pa.Table, app_id: str, next_offsets: dict[int, int],
                partition_by: list[str] | None = None, configuration: dict[str, str] | None = None) -> int:
    """Append ``rows`` and the next offset of each partition they cover in one commit (the table is created with
    ``partition_by`` and ``configuration`` if it is not there); the table's new version."""
    write_deltalake(
        str(path), rows, mode="append", partition_by=partition_by, configuration=configuration,
        commit_properties=CommitProperties(app_transactions=[
            Transaction(partition_app_id(app_id, p), offset) for p, offset in sorted(next_offsets.items())]))
    return DeltaTable(str(path)).version()


def append_rows(path: Path, rows: pa.Table) -> None:
    """Append rows that carry no offsets (a writer schema kept once in ``schemas``)."""
    write_deltalake(str(path), rows, mode="append")


def read_column(path: Path, column: str) -> list:
    """Every value of one column of a table (empty when there is no table)."""
    if not exists(path):
        return []
    return DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=[column]).column(column).to_pylist()


class KeyedAppends:
    """A table of the delivery log written by delta-rs: each row stored once by its keys, however often the log
    repeats it (a retried delivery batch logs its records again, possibly in a later batch of the writer).

    Per partition value (night) and source it keeps the highest key the table holds, read from the table when a
    partition first comes: a batch whose rows all lie above their marks is appended as it is; only one that
    reaches back to or below a mark reads the stored keys from that point on and leaves out the rows already
    there.  Exact because the writer is the table's only writer.
    """

    def __init__(self, path: Path, table: LogTable):
        self.path = path
        self.table = table
        self._marks: dict[object, dict[tuple, object]] = {}  # partition value -> {source: highest stored}

    def insert(self, rows: list[dict], app_id: str, next_offsets: dict[int, int]) -> int:
        """Append the rows the table does not hold yet with the log offsets they reach, in one commit (also when
        none is new, so the table's offsets keep up); how many were new."""
        keys, growing = self.table.keys, self.table.keys[-1]
        rows = list({tuple(row[k] for k in keys): row for row in rows}.values())
        spans: dict[tuple, tuple] = {}  # (partition value, source) -> (lowest, highest) growing key
        for row in rows:
            at = (self._part(row), self._source(row))
            low, high = spans.get(at, (row[growing], row[growing]))
            spans[at] = (min(low, row[growing]), max(high, row[growing]))
        self._load({part for part, _ in spans})
        if any((mark := self._marks[part].get(source)) is not None and low <= mark
               for (part, source), (low, _) in spans.items()):
            stored = self._stored_keys(min(low for low, _ in spans.values()), {part for part, _ in spans})
            rows = [row for row in rows if tuple(row[k] for k in keys) not in stored]
        partition_by = [self.table.partition_by] if self.table.partition_by else None
        append_once(self.path, pa.Table.from_pylist(rows, schema=self.table.schema), app_id, next_offsets,
                    partition_by)
        for (part, source), (_, high) in spans.items():
            marks = self._marks[part]
            marks[source] = high if marks.get(source) is None else max(marks[source], high)
        return len(rows)

    def _part(self, row: dict):
        return row[self.table.partition_by] if self.table.partition_by else None

    def _source(self, row: dict) -> tuple:
        return tuple(row[name] for name in self.table.sources)

    def _where(self, parts: set):
        """Rows of these partition values (a row without one is in the partition of nulls)."""
        column = pc.field(self.table.partition_by)
        where = column.isin(sorted(part for part in parts if part is not None))
        return where | column.is_null() if None in parts else where

    def _load(self, parts: set) -> None:
        missing = parts - self._marks.keys()
        if not missing:
            return
        for part in missing:
            self._marks[part] = {}
        if not exists(self.path):
            return
        group = ([self.table.partition_by] if self.table.partition_by else []) + list(self.table.sources)
        growing = self.table.keys[-1]
        stored = DeltaTable(str(self.path)).to_pyarrow_dataset().to_table(
            columns=list(dict.fromkeys(group + [growing])),
            filter=self._where(missing) if self.table.partition_by else None)
        for row in stored.group_by(group).aggregate([(growing, "max")]).to_pylist():
            self._marks[self._part(row)][self._source(row)] = row[f"{growing}_max"]

    def _stored_keys(self, lowest, parts: set) -> set[tuple]:
        """The keys of stored rows a batch whose smallest growing key is ``lowest`` could repeat."""
        if not exists(self.path):
            return set()
        where = pc.field(self.table.keys[-1]) >= lowest
        if self.table.partition_by:
            where = where & self._where(parts)
        stored = DeltaTable(str(self.path)).to_pyarrow_dataset().to_table(columns=list(self.table.keys),
                                                                          filter=where)
        return set(zip(*(stored.column(key).to_pylist() for key in self.table.keys), strict=True))
