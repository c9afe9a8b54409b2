"""DataFrame transformations as data: built once, applied to many DataFrames.

Every PySpark function call (``F.col``, ``F.when``, ``alias`` ...) is a round
trip to the JVM.  The delivery lane's query for a plan with a few dozen filters
takes thousands of them (1-2 s per micro-batch, measured), yet the Column
expressions never depend on the batch.  So the lane's modules describe their
transformations as :data:`Step` lists built once, and each batch only replays
them (:func:`apply_steps`): one round trip per step and per column passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame

# A DataFrame method and its arguments: ("select", (col, ...)), ("withColumns", ({name: col},)) or ("drop", names).
Step = tuple[str, tuple[Any, ...]]


def select(*columns: Any) -> Step:
    """A ``DataFrame.select`` of these columns (names or Columns)."""
    return "select", columns


def with_columns(columns: dict[str, Any]) -> Step:
    """A ``DataFrame.withColumns`` of these named columns (no step at all when there are none)."""
    return "withColumns", (columns,)


def drop(*names: str) -> Step:
    """A ``DataFrame.drop`` of these columns (by name)."""
    return "drop", names


def apply_steps(frame: DataFrame, steps: Sequence[Step]) -> DataFrame:
    """``frame`` with every step applied in order (empty ``withColumns`` steps are skipped)."""
    for method, arguments in steps:
        if method == "withColumns" and not arguments[0]:
            continue
        frame = getattr(frame, method)(*arguments)
    return frame


class JvmSteps:
    """Steps whose columns already live in the JVM, built once: applying them costs one round trip per step.

    Passing a list of Columns to a DataFrame method converts it to a JVM
    sequence one element at a time, a round trip each; a delivery batch with
    a hundred filters would pay hundreds per batch (tenths of a second).  The
    sequences are built here once, and :meth:`apply` hands them over as they are.
    An ``observe`` step attaches a fresh :class:`~pyspark.sql.Observation` per
    application (an observation observes one DataFrame).
    """

    def __init__(self, spark, steps: Sequence[Step]):
        from pyspark.sql.classic.column import _to_java_column, _to_seq

        context = spark.sparkContext
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for method, arguments in steps:
            if method == "withColumns":
                if arguments[0]:
                    names, columns = list(arguments[0]), list(arguments[0].values())
                    self.calls.append((method, (_to_seq(context, names),
                                                _to_seq(context, columns, _to_java_column))))
            elif method == "select":
                self.calls.append((method, (_to_seq(context, list(arguments), _to_java_column),)))
            elif method == "drop":
                self.calls.append((method, (_to_seq(context, list(arguments)),)))
            elif method == "observe":
                first, *rest = arguments
                self.calls.append((method, (first._jc, _to_seq(context, [c._jc for c in rest]))))
            else:
                raise ValueError(f"unknown step {method}")

    def apply(self, frame: DataFrame, observation=None) -> DataFrame:
        """``frame`` with every step applied in order; an ``observe`` step fills ``observation``."""
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

        jdf = frame._jdf
        for method, arguments in self.calls:
            if method == "observe":
                # what Observation._on does, with the figures' sequence built once
                jvm = frame.sparkSession.sparkContext._jvm
                observation._jvm = jvm
                observation._jo = getattr(jvm, "org.apache.spark.sql.Observation")(observation._name)
                jdf = jdf.observe(observation._jo, *arguments)
            else:
                jdf = getattr(jdf, method)(*arguments)
        return ClassicFrame(jdf, frame.sparkSession)


def observe(*figures: Any) -> Step:
    """An ``observe`` step of these aggregates (only in :class:`JvmSteps`, which attaches the observation)."""
    return "observe", figures
