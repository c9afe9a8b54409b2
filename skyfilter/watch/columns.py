"""The columns a stream adds for watchlists and watchmaps, and the match each alert carries to its brokers.

Filters see one column per list and map, in SQL and in Python alike::

    watchlists.my_agn.matched            -- true within a source's radius
    watchlists.my_agn.source_id          -- the nearest such source (and .source_name)
    watchlists.my_agn.separation_arcsec
    watchmaps.S251112cm.inside           -- true inside the map (a skymap: its credible region)
    watchmaps.S251112cm.credible_level   -- the smallest credible region holding the alert
    watchmaps.S251112cm.probability_density   -- per square degree

Each also has ``version``, the list's or map's table version.  Only the lists
and maps some running filter names are computed, in one pass per batch: a
pandas UDF in micro-batches, the stream's filter workers in Real-time Mode
(``skyfilter/filtering/filter_workers.py``).  A broker whose filters use lists or
maps gets the alert's matches as the ``watch`` header (JSON) and, in ``lite``
records, a ``watch`` field; the delivery log carries them to the ``matches`` table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.functions import pandas_udf

from skyfilter.core.config import Config
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.spark.steps import Step, drop, with_columns
from skyfilter.watch.crossmatch import LIST_OUTPUTS, MAP_OUTPUTS, WatchVersion, output_name, watch_outputs
from skyfilter.watch.store import KINDS, StoredVersion, current, names, unit, version_at

COLUMN = {"watchlist": "watchlists", "watchmap": "watchmaps"}
WATCH_FIELD = "watch"  # the header and the lite field of an alert's matches
_SPARK_TYPES = {"bool": T.BooleanType(), "str": T.StringType(), "float": T.DoubleType()}
_OUTPUTS = {"watchlist": LIST_OUTPUTS, "watchmap": MAP_OUTPUTS}
MATCH_TYPE = T.StructType([T.StructField(name, data_type) for name, data_type in (
    ("kind", T.StringType()), ("name", T.StringType()), ("version", T.LongType()), ("source_id", T.StringType()),
    ("source_name", T.StringType()), ("separation_arcsec", T.DoubleType()), ("credible_level", T.DoubleType()),
    ("probability_density", T.DoubleType()))])
MATCHES_TYPE = T.ArrayType(MATCH_TYPE)
WATCH_MATCHES_DDL = MATCHES_TYPE.simpleString()  # the ``watch`` column of the matches tables
REFERENCE = re.compile(r"\bwatch(list|map)s\s*\.\s*`?([A-Za-z_][A-Za-z0-9_]*)`?", re.IGNORECASE)
_ANSWER, _FLAT = "_watch_answer", "_watch"
WATCH_DOWN_COLUMN = "_watch_down"  # Real-time Mode: why the watch worker could not answer ("" once said), else null
_DOWN = "!"  # PythonFilterCall.WATCH_DOWN: the first character of a watch worker's answer when it cannot start


@dataclass(frozen=True)
class Watch:
    """The lists and maps a stream or a re-filter reads, each at one version."""

    versions: tuple[StoredVersion, ...] = ()

    def names(self, kind: str) -> list[str]:
        return [v.name for v in self.versions if v.kind == kind]

    def chosen(self, used: set[tuple[str, str]]) -> tuple[StoredVersion, ...]:
        """The versions of the lists and maps in ``used`` ((kind, name) pairs), in a stable order."""
        return tuple(v for v in self.versions if (v.kind, v.name) in used)

    def describe(self) -> str:
        """One phrase: each list and map with its version and size."""
        return ", ".join(f"{v.kind} {v.name} v{v.version} ({v.rows:,} {unit(v.kind)})" for v in self.versions) \
            or "none"


def load_watch(cfg: Config) -> Watch:
    """Every list and map there is now, at its newest version."""
    return Watch(tuple(v for kind in KINDS for v in current(cfg, kind).values()))


def watch_as_of(cfg: Config, when_ms: int) -> Watch:
    """Every list and map as it was at ``when_ms`` (ms since the epoch): what a night streamed then read."""
    found = (version_at(cfg, kind, name, when_ms) for kind in KINDS for name in names(cfg, kind))
    return Watch(tuple(version for version in found if version is not None))


def references(spec: FilterSpec) -> set[tuple[str, str]]:
    """The (kind, name) of every list and map a filter names."""
    texts = spec.columns if spec.kind == "python" else [spec.source]
    return {(f"watch{kind.lower()}", name) for text in texts for kind, name in REFERENCE.findall(text)}


def used_by(filters: list[FilterSpec]) -> set[tuple[str, str]]:
    """The lists and maps some of these filters name."""
    return {reference for spec in filters for reference in references(spec)}


def subscription_filters(brokers: list, brokers_file) -> list[FilterSpec]:
    """The filter a broker's ``watchlists:``/``watchmaps:`` subscription stands for, one per list or map:
    ``watchlist:my_agn`` keeps what ``watchlists.my_agn.matched`` keeps."""
    specs = {}
    for broker in brokers:
        for name in broker.filters:
            kind, _, target = name.partition(":")
            if kind in KINDS and name not in specs:
                field = "matched" if kind == "watchlist" else "inside"
                specs[name] = FilterSpec(name, brokers_file, "sql", f"{COLUMN[kind]}.{target}.{field}",
                                         line=broker.line)
    return list(specs.values())


def _struct_type(kind: str) -> T.StructType:
    return T.StructType([T.StructField(n, _SPARK_TYPES[t]) for n, t in _OUTPUTS[kind]]
                        + [T.StructField("version", T.LongType())])


def template_columns(watch: Watch) -> dict[str, Column]:
    """The watch columns, typed and empty, for checking filters: every list and map that exists."""
    columns = {}
    for kind in KINDS:
        names = watch.names(kind)
        if names:
            columns[COLUMN[kind]] = F.struct(*[F.lit(None).cast(_struct_type(kind)).alias(n) for n in names])
    return columns


def known_in(template: DataFrame) -> set[tuple[str, str]]:
    """The lists and maps a template frame has columns for."""
    known = set()
    for kind in KINDS:
        if COLUMN[kind] in template.columns:
            known |= {(kind, f.name) for f in template.schema[COLUMN[kind]].dataType.fields}
    return known


def flat_type(versions: tuple[StoredVersion, ...]) -> T.StructType:
    """The flat struct one pass returns: each list's and map's fields, by position."""
    return T.StructType([T.StructField(output_name(i, n), _SPARK_TYPES[t])
                         for i, v in enumerate(versions) for n, t in _OUTPUTS[v.kind]])


def watch_udf(versions: tuple[WatchVersion, ...], result: T.StructType):
    """The pandas UDF of a micro-batch: (accepted, ra, dec) -> the flat struct of :func:`flat_type`."""
    def evaluate(accepted: pd.Series, ra: pd.Series, dec: pd.Series) -> pd.DataFrame:
        out = watch_outputs(versions, ra.to_numpy(dtype=float, na_value=float("nan")),
                            dec.to_numpy(dtype=float, na_value=float("nan")),
                            accepted.fillna(False).to_numpy(dtype=bool))
        return pd.DataFrame(out, columns=result.fieldNames())

    return pandas_udf(evaluate, result)


def watch_steps(versions: tuple[StoredVersion, ...], ra: str, dec: str, accepted: Column, workers=None
                ) -> list[Step]:
    """The steps adding ``watchlists``/``watchmaps`` for these versions (none when there are none).

    ``ra``/``dec``: SQL expressions of the alert's position; ``workers``: the filter workers' watch set
    (a :class:`~skyfilter.filtering.filter_eval.FilterSet`, Real-time Mode) instead of a pandas UDF.
    """
    if not versions:
        return []
    result = flat_type(versions)
    position = [F.expr(ra).cast("double"), F.expr(dec).cast("double")]
    if workers is None:
        flat = [with_columns({_FLAT: watch_udf(tuple(v.for_workers() for v in versions), result)(accepted,
                                                                                                   *position)})]
    else:
        row = F.to_json(F.struct(position[0].alias("ra"), position[1].alias("dec")))
        answer, down = F.col(_ANSWER), F.col(_ANSWER).startswith(_DOWN)
        flat = [with_columns({_ANSWER: F.when(accepted, workers.call(row))}),
                with_columns({_FLAT: F.from_json(F.when(~down, answer), result),
                              WATCH_DOWN_COLUMN: F.when(down, F.expr(f"substring({_ANSWER}, 2)"))}),
                drop(_ANSWER)]
    structured = {}
    for kind in KINDS:
        members = [(i, v) for i, v in enumerate(versions) if v.kind == kind]
        if members:
            structured[COLUMN[kind]] = F.struct(*[
                F.struct(*[_flat_field(i, n, n == _OUTPUTS[kind][0][0]) for n, _ in _OUTPUTS[kind]],
                         F.lit(v.version).cast("long").alias("version")).alias(v.name) for i, v in members])
    return [*flat, with_columns(structured), drop(_FLAT)]


def watch_down_report(specs: list[FilterSpec]) -> Column:
    """Real-time Mode: on the alert where the watch worker was first found unable to start, the failure report
    (as :func:`~skyfilter.filtering.filter_eval.merge_reports` reads it) of each filter reading lists or maps;
    null elsewhere.  The stream quarantines those filters; the others go on."""
    down = F.col(WATCH_DOWN_COLUMN)
    entry = F.struct(F.lit(0.0).alias("seconds"), down.alias("error"), F.col("alert_id").alias("sample"))
    readers = [spec.name for spec in specs if references(spec)]
    pairs = [part for name in readers for part in (F.lit(name), entry)]
    return F.when(down.isNotNull() & (down != ""), F.to_json(F.create_map(*pairs)))


def _flat_field(position: int, field: str, flag: bool) -> Column:
    value = F.col(_FLAT)[output_name(position, field)]
    return (F.coalesce(value, F.lit(False)) if flag else value).alias(field)


def broker_matches(used: list[tuple[str, str]]) -> str:
    """SQL of the array of an alert's matches (:data:`MATCH_TYPE`) among the lists and maps a broker uses."""
    entries = []
    for kind, name in sorted(used):
        column = f"{COLUMN[kind]}.{name}"
        if kind == "watchlist":
            fields = (f"{column}.source_id", f"{column}.source_name", f"{column}.separation_arcsec",
                      "CAST(NULL AS DOUBLE)", "CAST(NULL AS DOUBLE)")
            flag = f"{column}.matched"
        else:
            fields = ("CAST(NULL AS STRING)", "CAST(NULL AS STRING)", "CAST(NULL AS DOUBLE)",
                      f"{column}.credible_level", f"{column}.probability_density")
            flag = f"{column}.inside"
        entries.append(
            f"CASE WHEN {flag} THEN named_struct('kind', '{kind}', 'name', '{name}', 'version', {column}.version, "
            + ", ".join(f"'{label}', {value}" for label, value in zip(
                ("source_id", "source_name", "separation_arcsec", "credible_level", "probability_density"), fields,
                strict=True)) + ") END")
    return f"array_compact(array({', '.join(entries)}))"


def broker_uses(enabled: list[str], filters: list[FilterSpec]) -> list[tuple[str, str]]:
    """The lists and maps a broker's working filters name."""
    by_name = {spec.name: spec for spec in filters}
    return sorted(used_by([by_name[name] for name in enabled if name in by_name]))
