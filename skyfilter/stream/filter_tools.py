"""Tools for filter authors: check a folder of filters against an alert schema.

Used by ``skyfilter filters check``; the checks are the stream's own
(Spark's parser and analyzer against the columns the stream gives filters).
"""

from __future__ import annotations

import json
from pathlib import Path

from skyfilter.core.avro_schemas import read_container, rubin_schema, schema_text
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterSpec, load_filters
from skyfilter.core.registry import open_registry, subject_for
from skyfilter.stream.filter_eval import validate_filters
from skyfilter.stream.input_schemas import single_schema
from skyfilter.stream.session import get_spark
from skyfilter.stream.stream_plan import template_frame


def schema_for_check(cfg: Config, topic: str | None, schema_path: str | None) -> tuple[str, str]:
    """(description, schema JSON): a topic's registered schema, a .avsc/.avro file, or the simulated Rubin one."""
    if topic:
        found = open_registry(cfg).latest(subject_for(topic))
        if found is None:
            raise SkyfilterError(f"no schema is registered for topic '{topic}'")
        return f"topic '{topic}' (schema id {found[0]})", found[1]
    if schema_path:
        path = Path(schema_path)
        if path.suffix == ".avsc":
            return str(path), schema_text(json.loads(path.read_text()))
        return str(path), schema_text(read_container(path)[0])
    version = cfg.simulation.schema_version
    return f"Rubin alert schema {version}", schema_text(rubin_schema(version))


def check_filters(cfg: Config, folder: Path, schema_json: str) -> tuple[list[FilterSpec], list[str]]:
    """Every filter of a folder checked against a schema: (the good ones, one line per problem)."""
    specs, load_problems = load_filters(folder)
    spark = get_spark("skyfilter-filters-check")
    template, _ = template_frame(spark, cfg, single_schema("filters-check", 0, schema_json))
    valid, problems = validate_filters(template, specs)
    return valid, [str(p) for p in [*load_problems, *problems]]
