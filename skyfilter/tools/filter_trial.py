"""Try one filter on sample alerts or an archived night: ``skyfilter filters test``.

Like ANTARES' devkit: how many alerts it keeps, how long it takes per alert,
and what the first matches look like, before the filter goes live.  The
filter runs through the stream's own code (Spark's checks, the shared pandas
UDF for Python filters), on a local frame of the sample.

Timing: a Python filter is timed alert by alert (one-row Arrow batches, the
time measured around the user's function).  A SQL filter runs inside Spark's
generated code, where single rows cannot be timed; its figure is the time of
a pass over at least 10,000 alerts (copies of the sample, only the columns the condition
reads) divided by the alerts, over several runs (Spark's job overhead included: an upper bound).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from skyfilter.archive.night_reader import NightSelection, read_messages
from skyfilter.core.alert_columns import detect, position_fields
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterSpec, load_filters
from skyfilter.filtering.decode import decode, is_accepted
from skyfilter.filtering.filter_eval import (
    PYTHON_COLUMN,
    REPORT_FIELD,
    add_filter_columns,
    filter_column,
    merge_reports,
    struct_paths,
    validate_filters,
)
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.kafka.read_back import percentile
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA
from skyfilter.plan.tables import table_paths
from skyfilter.schemas.avro import avro_files, fingerprint, read_container, schema_text
from skyfilter.schemas.reader import reader_for
from skyfilter.schemas.wire import frame
from skyfilter.spark.internals import referenced_columns, unresolved_column_names
from skyfilter.spark.steps import apply_steps
from skyfilter.watch.columns import Watch, load_watch, references, template_columns, watch_steps

SQL_TIMING_RUNS = 10
SQL_TIMING_ROWS = 10_000  # SQL filters are timed over at least this many alerts (copies of the sample)


@dataclass
class TrialReport:
    """What one filter did on a sample."""

    name: str
    kind: str
    source: str
    scanned: int
    matched: int
    per_alert_ms: list[float]
    timing_note: str
    columns: list[str] = field(default_factory=list)
    first_matches: list[dict] = field(default_factory=list)
    error: str | None = None  # a Python filter that failed: what the stream would quarantine it for

    @property
    def match_rate(self) -> float:
        return self.matched / self.scanned if self.scanned else 0.0

    def lines(self) -> list[str]:
        """The report as printed by ``skyfilter filters test``."""
        out = [f"error: {self.error}"] if self.error else []
        out += [f"filter {self.name} ({self.kind}) on {self.source}",
               f"alerts scanned: {self.scanned}", f"matched:        {self.matched}",
               f"match rate:     {100 * self.match_rate:.2f} %"]
        if self.per_alert_ms:
            p50, p90, p99 = (percentile(self.per_alert_ms, q) for q in (0.5, 0.9, 0.99))
            out.append(f"time per alert: p50 {p50:.4f} ms, p90 {p90:.4f} ms, p99 {p99:.4f} ms ({self.timing_note})")
        if self.first_matches:
            out.append(f"first {len(self.first_matches)} match(es):")
            for row in self.first_matches:
                out.append("  " + ", ".join(f"{k}={_short(v)}" for k, v in row.items()))
        return out


def sample_frame(spark: SparkSession, cfg: Config, paths: list[str | Path]) -> tuple[DataFrame, str]:
    """The alerts of Avro container files, decoded exactly as the stream decodes Kafka messages.

    Files of several versions of one survey's schema are read as the stream reads a topic
    that carries them: each with its own schema, onto the newest one widened
    (``skyfilter/schemas/reader.py``).
    """
    files = avro_files(paths)
    writers: dict[str, int] = {}  # fingerprint -> id, in the order first seen
    schemas: list[tuple[int, dict]] = []
    rows, now = [], dt.datetime.now(dt.UTC)
    for path in files:
        file_schema, records = read_container(path)
        schema_id = writers.setdefault(fingerprint(file_schema), len(writers))
        if schema_id == len(schemas):
            schemas.append((schema_id, file_schema))
        rows += [(None, frame(schema_id, record.body), "sample", 0, len(rows) + i, now, 0)
                 for i, record in enumerate(records)]
    reader, unreadable = reader_for(schemas)
    if unreadable:
        raise SkyfilterError(f"{files[0].parent}: sample files of other alerts than the others: "
                             f"{next(iter(unreadable.values()))}; test one survey's alerts at a time")
    inputs = InputSchemas("sample", reader, {i: schema_text(schema) for i, schema in schemas})
    raw = spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)
    decoded = decode(raw, inputs, detect(reader, cfg), cfg.stream.night_offset_hours)
    return decoded, f"{len(files)} sample file(s)"


def night_frame(spark: SparkSession, cfg: Config, name: str, night: str) -> tuple[DataFrame, str]:
    """The archived alerts of one night of a stream, as the stream's filters saw them."""
    messages, _ = read_messages(spark, table_paths(cfg, name), NightSelection(night, None, None, None))
    return messages.withColumn("reject_reason", F.lit(None).cast("string")), f"night {night} of '{name}'"


def find_filter(folder: Path, name: str) -> FilterSpec:
    """The filter named ``name`` in a folder (a load problem is an error)."""
    specs, problems = load_filters(folder)
    for spec in specs:
        if spec.name == name:
            return spec
    for problem in problems:
        if problem.path.stem == name:
            raise SkyfilterError(str(problem))
    known = ", ".join(sorted(s.name for s in specs)) or "none"
    raise SkyfilterError(f"no filter '{name}' in {folder} (filters there: {known})")


def run_trial(spark: SparkSession, spec: FilterSpec, alerts: DataFrame, source: str, limit: int | None = None,
              show: int = 5, cfg: Config | None = None) -> TrialReport:
    """Run one filter over a frame of decoded alerts; counts, per-alert timing and the first matches.

    With ``cfg``, the filter may use that state's watchlists and watchmaps (their newest versions).
    """
    watch = load_watch(cfg) if cfg is not None else Watch()
    valid, problems = validate_filters(alerts.withColumns(template_columns(watch)), [spec])
    if problems:
        raise SkyfilterError(str(problems[0]))
    spec = valid[0]
    ra, dec = position_fields(set(struct_paths(alerts.schema)), cfg)
    alerts = apply_steps(alerts, watch_steps(watch.chosen(references(spec)), ra, dec, is_accepted()))
    sample = (alerts.limit(limit) if limit else alerts).where(is_accepted()).cache()
    scanned = sample.count()
    evaluated = add_filter_columns(sample, [spec], F.lit(True))
    verdict = F.col(filter_column(spec.name))
    error = None
    if spec.kind == "python":
        (per_alert, error), note = _python_timings(spark, evaluated, spec), "Python, timed alert by alert"
    else:
        per_alert, note = _sql_timings(sample, spec, scanned)
    columns = shown_columns(spark, spec)
    matches = evaluated.where(verdict)
    matched = matches.count()
    first = matches.orderBy(F.length("alert_id"), "alert_id").limit(show) \
        .select("alert_id", *[F.expr(expression).alias(name) for name, expression in columns]).collect()
    sample.unpersist()
    return TrialReport(spec.name, spec.kind, source, scanned, matched, per_alert, note,
                       [n for n, _ in columns], [row.asDict() for row in first], error)


def _python_timings(spark: SparkSession, evaluated: DataFrame, spec: FilterSpec) -> tuple[list[float], str | None]:
    """Each alert's time in a Python filter (called one alert at a time), and the first failure, if any, as
    ``<file>:<line>: <error> (alert <id>)``."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "1")
    try:
        reports = evaluated.select(F.col(PYTHON_COLUMN)[REPORT_FIELD].alias("report")).collect()
    finally:
        spark.conf.set(key, before)
    merged = [merge_reports([row.report])[spec.name] for row in reports if row.report]
    failed = next((entry for entry in merged if entry.get("error")), None)
    error = None if failed is None else \
        f"{spec.path}:{spec.line}: {failed['error']} (alert {failed.get('sample')}); the stream would quarantine it"
    return [entry["seconds"] * 1000.0 for entry in merged], error


def _sql_timings(sample: DataFrame, spec: FilterSpec, scanned: int) -> tuple[list[float], str]:
    copies = max(1, -(-SQL_TIMING_ROWS // max(scanned, 1)))
    copy_ids = sample.sparkSession.range(copies).withColumnRenamed("id", "_copy")
    repeated = sample.select(*condition_columns(sample, spec.condition)).crossJoin(copy_ids).cache()
    rows = repeated.count()
    condition = F.count_if(F.expr(spec.condition))
    repeated.agg(condition).collect()  # compile once before timing
    runs = []
    for _ in range(SQL_TIMING_RUNS):
        began = time.perf_counter()
        repeated.agg(condition).collect()
        runs.append((time.perf_counter() - began) * 1000.0 / rows)
    repeated.unpersist()
    return runs, (f"SQL in Spark: time of one pass over {rows} alerts ({copies} copies of the sample) / alerts, "
                  f"{SQL_TIMING_RUNS} runs, job overhead included")


def condition_columns(frame: DataFrame, condition: str) -> list[str]:
    """The top-level columns of ``frame`` a SQL condition reads.

    The timing pass copies the sample 10,000 times or more: whole Rubin alerts (their
    histories) would fill the driver's memory, the columns the filter reads do not.
    """
    names = referenced_columns(frame, condition)
    return [name for name in frame.columns if name in names] or frame.columns[:1]


def shown_columns(spark: SparkSession, spec: FilterSpec) -> list[tuple[str, str]]:
    """The key columns of a filter's matches: its SELECT list, its Python columns, or those its condition reads."""
    if spec.selects:
        return [(n, e) for n, e in spec.selects if n != "alert_id"]
    if spec.kind == "python":
        return [(c, c) for c in spec.columns]
    names = unresolved_column_names(spark, spec.condition)
    return [(n, n) for n in dict.fromkeys(names) if n != "alert_id"]


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
