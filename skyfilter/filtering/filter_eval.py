"""Filters inside Spark: checked by Spark's own parser and analyzer, evaluated in one pass.

SQL filters become Spark expressions (no Python in the loop).  All Python
filters of a stream share one vectorized pandas UDF, so each batch crosses
into Python once; a filter that raises is isolated there: its column is null
for that batch and its error travels back to the driver in a side report.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.functions import pandas_udf

from skyfilter.core.filter_loader import FilterProblem, FilterSpec, filter_function
from skyfilter.filtering.sql_filters import analyze_sql, explain
from skyfilter.spark.internals import arrow_schema_of
from skyfilter.spark.steps import Step, apply_steps, drop, with_columns
from skyfilter.watch.columns import references

PYTHON_COLUMN = "_python_filters"
REPORT_FIELD = "_report"
WORKER_ANSWER = "_python_answer"
PYTHON_FILTER_FUNCTION = "skyfilter_python_filters"  # PythonFilterCall.java's SQL function
FAILED_HERE: set[tuple[str, str]] = set()  # (UDF, filter) pairs that raised in this Python worker

# pyspark logs every analysis error with a full JVM stack trace; we report our own one-liners.
for _logger in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
    logging.getLogger(_logger).setLevel(logging.CRITICAL)


def filter_column(name: str) -> str:
    """The boolean column holding a filter's verdict in the evaluated batch."""
    return f"_f_{name}"


def struct_paths(schema: T.StructType, prefix: str = "") -> list[str]:
    """Every dotted field path of a Spark schema (for 'did you mean' hints)."""
    paths = []
    for field in schema.fields:
        paths.append(prefix + field.name)
        if isinstance(field.dataType, T.StructType):
            paths.extend(struct_paths(field.dataType, prefix + field.name + "."))
    return paths


def validate_filters(frame: DataFrame, specs: list[FilterSpec]) -> tuple[list[FilterSpec], list[FilterProblem]]:
    """Check each filter against the columns of ``frame`` (analysis only, no data read).

    Returns the filters that may run and one problem per broken filter.  They are
    checked against an empty relation of ``frame``'s columns: what a filter reads and
    what its plan holds are the same, and Spark analyses it without the decoding
    beneath (100 filters took 12 s of a stream's start against the decoded frame).
    """
    frame = frame.sparkSession.createDataFrame([], frame.schema)
    paths = struct_paths(frame.schema)
    enabled, problems = [], []
    for spec in specs:
        problem = _check_sql(frame, spec, paths) if spec.kind == "sql" else _check_python(frame, spec, paths)
        if problem is None:
            enabled.append(spec)
        else:
            problems.append(problem)
    return enabled, problems


def _check_sql(frame: DataFrame, spec: FilterSpec, paths: list[str]) -> FilterProblem | None:
    shape = analyze_sql(frame, spec, paths)
    if isinstance(shape, FilterProblem):
        return shape
    spec.condition, spec.selects = shape.condition, shape.selects
    return None


def _check_python(frame: DataFrame, spec: FilterSpec, paths: list[str]) -> FilterProblem | None:
    for column in spec.columns:
        try:
            _ = frame.select(F.col(column)).schema
        except AnalysisException as exc:
            return FilterProblem(spec.path, spec.line, explain(exc, paths, column))
    return None


# --------------------------------------------------------------------------- evaluation
def python_filters_column(specs: list[FilterSpec], accepted: Column, budget_s: float = 0.0,
                          timings: bool = True) -> Column:
    """One pandas UDF evaluating every Python filter.

    Returns a struct with each filter's verdict and a ``_report`` field: on the
    first row of each Arrow batch, a JSON object giving per filter the seconds
    it spent, and if it raised, its error and an alert id of that batch
    (:func:`merge_reports` sums them on the driver); without ``timings``, only
    when a filter raised (Real-time Mode, whose Arrow batches are a few rows).
    Only rows where ``accepted`` is true reach the filters (a rejected message
    has no alert); the others get a null verdict.

    A call longer than ``budget_s`` seconds is interrupted (:func:`time_limit`)
    and counts as raising.  A filter that raised is not called again by this
    Python worker (its verdicts are null): a quarantine
    takes effect at once, before the driver has heard of it.  Each UDF made here
    keeps its own record: another stream, a reload or a trial starts afresh.
    """
    udf_id = uuid.uuid4().hex
    columns = list(dict.fromkeys(c for spec in specs for c in spec.columns))
    plan = [(spec, [columns.index(c) for c in spec.columns]) for spec in specs]
    fields = [T.StructField(spec.name, T.BooleanType()) for spec in specs]
    fields.append(T.StructField(REPORT_FIELD, T.StringType()))

    def evaluate(mask, alert_ids, *series):
        rows = len(mask)
        keep = mask.fillna(False).astype(bool).to_numpy()
        kept = int(keep.sum())
        inputs = [s[keep].reset_index(drop=True).infer_objects() for s in series]
        sample = alert_ids[keep].iloc[0] if kept else None
        out, report = {}, {}
        for spec, positions in plan:
            values, missing = np.zeros(rows, dtype=bool), np.ones(rows, dtype=bool)
            began = time.perf_counter()
            entry = {}
            try:
                if kept and (udf_id, spec.name) not in FAILED_HERE:
                    with time_limit(budget_s):
                        result = filter_function(spec)(*[inputs[i] for i in positions])
                    verdict = as_verdict(result, kept)
                    values[keep] = verdict.fillna(False).to_numpy(dtype=bool)
                    missing[keep] = verdict.isna().to_numpy()
            except Exception as exc:  # noqa: BLE001 - a failing filter must not stop the others
                values[:], missing[:] = False, True
                entry = {"error": f"{type(exc).__name__}: {exc}", "sample": sample}
                FAILED_HERE.add((udf_id, spec.name))
            out[spec.name] = pd.arrays.BooleanArray(values, missing)
            if timings or entry:
                report[spec.name] = {"seconds": time.perf_counter() - began, **entry}
        first = json.dumps(report) if report else None
        out[REPORT_FIELD] = pd.Series([first] + [None] * (rows - 1), dtype=object)
        return pd.DataFrame(out)

    return pandas_udf(evaluate, T.StructType(fields))(accepted, F.col("alert_id"), *[F.col(c) for c in columns])


class FilterTimeout(Exception):
    """A Python filter call ran past its time budget."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block with :class:`FilterTimeout` after ``seconds`` (0: no limit).

    A hung filter (a loop that never ends, a wait on nothing) would hold its task,
    and in Real-time Mode its partition, for good.  The Python worker runs
    filters in its main thread, where an interval timer's signal can interrupt
    them; elsewhere (a thread) the block runs unlimited.
    """
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum, _frame):
        raise FilterTimeout(f"did not return within its {seconds:g} s budget (stream.filter_time_budget_s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def merge_reports(reports: list[str]) -> dict[str, dict]:
    """The Arrow batches' reports of :func:`python_filters_column` as one per filter:
    ``{"seconds": total, "error": first error or None, "sample": its alert id or None}``."""
    merged: dict[str, dict] = {}
    for text in reports:
        for name, entry in json.loads(text).items():
            total = merged.setdefault(name, {"seconds": 0.0, "error": None, "sample": None})
            total["seconds"] += entry["seconds"]
            if entry.get("error") and not total["error"]:
                total["error"], total["sample"] = entry["error"], entry.get("sample")
    return merged


def as_verdict(result, rows: int) -> pd.Series:
    """A filter's return value as a nullable boolean Series of the batch's length."""
    if isinstance(result, pd.DataFrame) or not hasattr(result, "__len__"):
        raise TypeError(f"filter returned {type(result).__name__}, expected a boolean Series")
    verdict = pd.Series(result).reset_index(drop=True)
    if len(verdict) != rows:
        raise TypeError(f"filter returned {len(verdict)} values for {rows} alerts")
    if verdict.dtype == object and verdict.map(lambda v: v is None or isinstance(v, bool)).all():
        return verdict.astype("boolean")
    if not (pd.api.types.is_bool_dtype(verdict.dtype)):
        raise TypeError(f"filter returned {verdict.dtype} values, expected booleans")
    return verdict.astype("boolean")


def add_filter_columns(frame: DataFrame, specs: list[FilterSpec], accepted: Column) -> DataFrame:
    """Append one non-null boolean column per filter (and the Python side column).

    A filter is true only on accepted rows; null verdicts count as no match.
    """
    return apply_steps(frame, filter_steps(specs, accepted))


@dataclass(frozen=True)
class FilterSet:
    """What a Real-time query hands the Python filter workers of the JVM running each task: the worker's role
    (``filters`` or ``watch``), the set's id and its content (``skyfilter/filtering/filter_workers.py``)."""

    role: str
    set_id: str
    content: str

    def call(self, row: Column) -> Column:
        """The workers' answer for each alert's ``row`` (JSON)."""
        return F.call_function(PYTHON_FILTER_FUNCTION, F.lit(self.role), F.lit(self.set_id), F.lit(self.content),
                               row)


def worker_answer_column(specs: list[FilterSpec], accepted: Column, workers: FilterSet) -> Column:
    """Each accepted alert's answer from the stream's Python filter workers (``skyfilter/filtering/filter_workers.py``):
    its filters' columns sent as JSON, alert by alert (Real-time Mode)."""
    columns = list(dict.fromkeys(c for spec in specs for c in spec.columns))
    row = F.to_json(F.struct(F.col("alert_id").alias("alert_id"),
                             *[F.col(c).alias(f"c{i}") for i, c in enumerate(columns)]))
    return F.when(accepted, workers.call(row))


def worker_verdicts_column(specs: list[FilterSpec]) -> Column:
    """The :data:`PYTHON_COLUMN` struct (a verdict per filter, ``_report``) of the workers' answers in
    :data:`WORKER_ANSWER`: ``1``/``0``/``n`` per filter, then the failures as JSON after a line break."""
    answer = F.col(WORKER_ANSWER)
    fields = [F.when(F.substring(answer, i + 1, 1) != "n", F.substring(answer, i + 1, 1) == "1").alias(spec.name)
              for i, spec in enumerate(specs)]
    report = F.when(F.instr(answer, "\n") > 0, F.substring_index(answer, "\n", -1)).alias(REPORT_FIELD)
    return F.struct(*fields, report)


def worker_filter_set(specs: list[FilterSpec], frame: DataFrame) -> tuple[list[dict], bytes]:
    """The filter set the workers load for ``specs`` (their code, and each one's column positions) and the Arrow
    schema of those columns in ``frame`` (the decoded alerts)."""
    columns = list(dict.fromkeys(c for spec in specs for c in spec.columns))
    filters = [{"name": spec.name, "path": str(spec.path), "source": spec.source, "function": spec.function_name,
                "positions": [columns.index(c) for c in spec.columns]} for spec in specs]
    schema = frame.select(*[F.col(c).alias(f"c{i}") for i, c in enumerate(columns)]).schema
    return filters, arrow_schema_of(schema)


def filter_steps(specs: list[FilterSpec], accepted: Column, budget_s: float = 0.0, timings: bool = True,
                 workers: FilterSet | None = None, watch_down: Column | None = None) -> list[Step]:
    """The steps of :func:`add_filter_columns`, to build once and apply to many batches (``budget_s``,
    ``timings``: see :func:`python_filters_column`; with ``workers``, the Python filters are those workers'
    set, called alert by alert instead of in a pandas UDF).  ``watch_down``: true where the watch worker
    could not answer; the filters reading lists or maps have no verdict there (so no match)."""
    python_specs = [s for s in specs if s.kind == "python"]
    python = {PYTHON_COLUMN: python_filters_column(python_specs, accepted, budget_s, timings)} \
        if python_specs and workers is None else {}
    if python_specs and workers is not None:  # a step of its own: the struct reads the answer many times
        python_steps = [with_columns({WORKER_ANSWER: worker_answer_column(python_specs, accepted, workers)}),
                        with_columns({PYTHON_COLUMN: worker_verdicts_column(python_specs)}), drop(WORKER_ANSWER)]
    else:
        python_steps = [with_columns(python)]
    verdicts = {}
    for spec in specs:
        raw = F.expr(spec.condition) if spec.kind == "sql" else F.col(PYTHON_COLUMN)[spec.name]
        if watch_down is not None and references(spec):
            raw = F.when(~watch_down, raw)
        verdicts[filter_column(spec.name)] = accepted & F.coalesce(raw, F.lit(False))
    return [*python_steps, with_columns(verdicts)]
