"""Tools for filter authors: check a folder of filters against an alert schema.

Used by ``skyfilter filters check``; the checks are the stream's own
(Spark's parser and analyzer against the columns the stream gives filters).
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterSpec, load_filters
from skyfilter.filtering.filter_eval import validate_filters
from skyfilter.filtering.input_schemas import single_schema
from skyfilter.plan.stream_plan import template_frame
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import rubin_schema, schema_file, schema_text
from skyfilter.spark.session import get_spark
from skyfilter.watch.columns import load_watch


def schema_for_check(cfg: Config, topic: str | None, schema_path: str | None) -> tuple[str, str]:
    """(description, schema JSON): a topic's registered schema, a .avsc/.avro file, or the simulated Rubin one."""
    if topic:
        found = open_registry(cfg).latest(subject_for(topic))
        if found is None:
            raise SkyfilterError(f"no schema is registered for topic '{topic}'")
        return f"topic '{topic}' (schema id {found[0]})", found[1]
    if schema_path:
        return schema_path, schema_text(schema_file(schema_path))
    version = cfg.simulation.schema_version
    return f"Rubin alert schema {version}", schema_text(rubin_schema(version))


# A Python filter's column holding more values than this per alert gets a note from `filters check`.
WIDE_COLUMN_FIELDS = 20


def check_filters(cfg: Config, folder: Path, schema_json: str) -> tuple[list[FilterSpec], list[str]]:
    """Every filter of a folder checked against a schema: (the good ones, one line per problem)."""
    specs, load_problems = load_filters(folder)
    valid, problems = validate_filters(_template(cfg, schema_json), specs)
    return valid, [str(p) for p in [*load_problems, *problems]]


def cost_notes(cfg: Config, specs: list[FilterSpec], schema_json: str) -> list[str]:
    """Advice, one line each, for Python filters that name whole records: every field of a named record
    (for a history, of each of its entries) is moved into pandas for every alert, whether the filter reads it
    or not.  Naming the fields read instead (``prvDiaSources.psfFlux``) passes one array of numbers per field."""
    template = _template(cfg, schema_json)
    notes = []
    for spec in (s for s in specs if s.kind == "python"):
        for column in spec.columns:
            data_type = template.select(F.col(column)).schema.fields[0].dataType
            record = data_type.elementType if isinstance(data_type, T.ArrayType) else data_type
            fields = leaf_fields(data_type)
            if isinstance(record, T.StructType) and fields > WIDE_COLUMN_FIELDS:
                whose = "each entry of the array" if record is not data_type else "the record"
                notes.append(f"{spec.path}:{spec.line}: note: '{column}' hands the filter all {fields} fields of "
                             f"{whose} for every alert; name only the fields it reads (e.g. "
                             f"'{column}.{record.fields[0].name}'), each then arrives as one value or array of values")
    return notes


def leaf_fields(data_type: T.DataType) -> int:
    """How many values one value of this type carries, counting an array's element type once."""
    if isinstance(data_type, T.StructType):
        return sum(leaf_fields(field.dataType) for field in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return leaf_fields(data_type.elementType)
    return 1


def _template(cfg: Config, schema_json: str) -> DataFrame:
    spark = get_spark("skyfilter-filters-check")
    return template_frame(spark, cfg, single_schema("filters-check", 0, schema_json), load_watch(cfg))[0]
