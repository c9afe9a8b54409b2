"""Rows of the delivery log into Delta tables once each, however often the log repeats them.

A delivery batch that is retried logs its records again, possibly in a later
batch of the archive's log query, so a table of the log (``matches``,
``metrics``, ``broker_visits``) may be offered a row it already holds.  Each
row is known by its keys, the last of which grows along a *source*: the
offset along an input partition, the batch id along a query.
:class:`StoredMarks` keeps, per source, the highest key the table holds.  A
batch whose rows all lie above their source's mark cannot repeat a stored row
and is appended as it is: one Spark job for its spans, one for the append.
Only a batch that reaches back to or below a mark (a retried delivery batch,
or records of one delivery batch split over two log batches) reads the
stored keys back and leaves out the rows already there.  The marks start from
the table itself (per night, when a night first comes), so they hold across
restarts of the archive lane.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from skyfilter.plan.tables import append, is_table


class StoredMarks:
    """A table of the delivery log: its rows' ``keys``, and the highest key it holds per source of its rows, per
    partition (night), loaded when first needed.

    ``sources``: the key columns that name a source (e.g. the input topic and partition); the last key grows
    along it (e.g. the input offset).
    """

    def __init__(self, path: Path, keys: list[str], sources: list[str], partition_by: str | None = None):
        self.path = path
        self.keys = keys
        self.sources = sources
        self.growing = keys[-1]
        self.partition_by = partition_by
        self._marks: dict[object, dict[tuple, object]] = {}  # partition value -> {source: highest stored}

    def insert(self, frame: DataFrame, app_id: str, batch_id: int) -> None:
        """Append the rows of ``frame`` the table does not hold yet, once per (app_id, batch_id)."""
        insert_new(frame, self.path, self.keys, app_id, batch_id, self.partition_by, self)

    def above(self, spark: SparkSession, spans: list[Row]) -> bool:
        """Whether every span (partition, source, low, high) lies above what the table holds of its source."""
        self._load(spark, {self._part(span) for span in spans})
        for span in spans:
            stored = self._marks[self._part(span)].get(self._source(span))
            if stored is not None and span["low"] <= stored:
                return False
        return True

    def raise_to(self, spans: list[Row]) -> None:
        """Take in spans now stored (partitions not loaded yet are read from the table when they come)."""
        for span in spans:
            marks = self._marks.get(self._part(span))
            if marks is not None:
                source = self._source(span)
                marks[source] = span["high"] if marks.get(source) is None else max(marks[source], span["high"])

    def _load(self, spark: SparkSession, parts: set) -> None:
        missing = parts - self._marks.keys()
        if not missing:
            return
        for part in missing:
            self._marks[part] = {}
        stored = spark.read.format("delta").load(str(self.path))
        if self.partition_by:
            stored = stored.where(F.col(self.partition_by).isin(list(missing)))
        group = ([self.partition_by] if self.partition_by else []) + self.sources
        for row in stored.groupBy(*group).agg(F.max(self.growing).alias("high")).collect():
            self._marks[self._part(row)][self._source(row)] = row["high"]

    def _part(self, row: Row):
        return row[self.partition_by] if self.partition_by else None

    def _source(self, row: Row) -> tuple:
        return tuple(row[name] for name in self.sources)


def insert_new(frame: DataFrame, path: Path, keys: list[str], app_id: str, batch_id: int,
               partition_by: str | None = None, marks: StoredMarks | None = None) -> None:
    """Append the rows of ``frame`` whose ``keys`` are not in the Delta table yet, once per (app_id, batch_id).

    The last key grows with time (an offset, a batch id).  With ``marks`` (the table's :class:`StoredMarks`),
    rows that all lie above what is stored of their source are appended without reading the table; otherwise
    only stored rows at or above the batch's smallest key are compared (Delta skips the files of earlier
    batches), and with ``partition_by`` only the partitions the rows fall in are read.  Cheaper than a MERGE
    and as exact, the archive lane being the tables' only writer.
    """
    rows = frame.dropDuplicates(keys)
    spark = frame.sparkSession
    growing = keys[-1]
    group = ([partition_by] if partition_by else []) + (marks.sources if marks else [])
    spans = rows.groupBy(*group).agg(F.min(growing).alias("low"), F.max(growing).alias("high")).collect()
    if not spans:
        return
    if is_table(spark, path) and not (marks is not None and marks.above(spark, spans)):
        rows = rows.join(_stored_keys(spark, path, keys, spans, partition_by), _same(keys), "left_anti")
    append(rows, path, app_id, batch_id, partition_by, merge_schema=True)  # new columns reach older tables
    if marks is not None:
        marks.raise_to(spans)


def _stored_keys(spark: SparkSession, path: Path, keys: list[str], spans: list[Row], partition_by: str | None
                 ) -> DataFrame:
    """The keys of stored rows that a batch with these spans could repeat."""
    stored = spark.read.format("delta").load(str(path)).where(F.col(keys[-1]) >= min(span["low"] for span in spans))
    if partition_by:
        stored = stored.where(F.col(partition_by).isin(sorted({span[partition_by] for span in spans})))
    return stored.select(*[F.col(f"`{key}`").alias(f"_stored_{key}") for key in keys])


def _same(keys: list[str]):
    same = F.lit(True)
    for key in keys:
        same = same & F.col(f"`{key}`").eqNullSafe(F.col(f"_stored_{key}"))
    return same
