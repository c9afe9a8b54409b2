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

# A DataFrame method and its arguments: ("select", (col, ...)) or ("withColumns", ({name: col},)).
Step = tuple[str, tuple[Any, ...]]


def select(*columns: Any) -> Step:
    """A ``DataFrame.select`` of these columns (names or Columns)."""
    return "select", columns


def with_columns(columns: dict[str, Any]) -> Step:
    """A ``DataFrame.withColumns`` of these named columns (no step at all when there are none)."""
    return "withColumns", (columns,)


def apply_steps(frame: DataFrame, steps: Sequence[Step]) -> DataFrame:
    """``frame`` with every step applied in order (empty ``withColumns`` steps are skipped)."""
    for method, arguments in steps:
        if method == "withColumns" and not arguments[0]:
            continue
        frame = getattr(frame, method)(*arguments)
    return frame
