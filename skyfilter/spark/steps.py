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

from skyfilter.spark.internals import apply_jvm_steps, jvm_steps

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
        self.calls = jvm_steps(spark, steps)

    def apply(self, frame: DataFrame, observation=None) -> DataFrame:
        """``frame`` with every step applied in order; an ``observe`` step fills ``observation``."""
        return apply_jvm_steps(frame, self.calls, observation)


def observe(*figures: Any) -> Step:
    """An ``observe`` step of these aggregates (only in :class:`JvmSteps`, which attaches the observation)."""
    return "observe", figures
