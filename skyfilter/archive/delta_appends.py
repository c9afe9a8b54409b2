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
