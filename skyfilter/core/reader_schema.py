"""One reader schema for all the writer schemas an input topic carries.

Surveys move their alert schema on during a season (Rubin went 7.4 -> 9.0 ->
10.0 -> 11.0 -> 11.1 in two years), and a topic then holds alerts of several
versions.  The stream reads each alert with its own writer schema, resolved
onto one *reader* schema, so that filters see one set of columns.

The reader is the newest version, *widened*: a field that an older version
may leave null, or does not have, becomes nullable with a null default.  A
plain newest version often cannot read its elder (Rubin 11.0 made
``diaSource.psfNdata`` and others non-null, so 10.0 data with a null there
fails); the widened one reads both.  A writer that still cannot be read, or
that shares few top-level fields with the newest (another survey's alerts),
is left out with the reason.
"""

from __future__ import annotations

import copy
import json

from skyfilter.core.avro_schemas import clean_schema
from skyfilter.core.schema_compat import read_problems

SAME_FAMILY_SHARE = 0.5  # top-level fields a version must share with the newest to be widened over


def widened(reader: dict, writer: dict) -> dict:
    """A copy of ``reader`` in which every field ``writer`` may leave null, or leaves out, is nullable (default null).

    Nested records are widened field by field too; the result's Spark columns
    are the reader's, only their nullability changes.
    """
    from fastavro.schema import expand_schema

    result = copy.deepcopy(clean_schema(reader))
    _widen_record(result, expand_schema(clean_schema(writer)))
    return result


def reader_for(writers: list[tuple[int, dict]]) -> tuple[dict, dict[int, str]]:
    """The reader schema of a topic's writers ``(id, schema)``, newest last, and the reason for each one left out.

    Returns ``(reader, unreadable)``: ``unreadable`` maps the ids the reader
    cannot read to one line saying why.
    """
    if not writers:
        raise ValueError("no writer schema")
    reader = clean_schema(writers[-1][1])
    unreadable: dict[int, str] = {}
    for schema_id, writer in reversed(writers[:-1]):
        candidate = widened(reader, writer)
        problem = reading_problem(candidate, schema_id, writer)
        if problem is None:
            reader = candidate
        else:
            unreadable[schema_id] = problem
    return reader, unreadable


def reading_problem(reader: dict, schema_id: int, writer: dict | str) -> str | None:
    """One line saying why alerts of writer ``schema_id`` cannot be read as ``reader`` (None when they can)."""
    writer = json.loads(writer) if isinstance(writer, str) else writer
    share = _shared_share(reader, writer)
    if share < SAME_FAMILY_SHARE:
        problems = [f"it shares {share:.0%} of the top-level fields of {schema_name(reader)}: not the same alerts"]
    else:
        problems = read_problems(reader, writer)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"schema id {schema_id} ({schema_name(writer)}) cannot be read as this stream's alerts: {problems[0]}{more}"


def schema_name(schema: dict | str) -> str:
    """A schema's full name (``lsst.v10_0.alert``), for messages."""
    definition = json.loads(schema) if isinstance(schema, str) else schema
    namespace = definition.get("namespace")
    name = definition.get("name", "?")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def _shared_share(reader: dict, writer: dict) -> float:
    names = {f["name"] for f in reader["fields"]}
    return len(names & {f["name"] for f in writer["fields"]}) / max(1, len(names))


def _is_nullable(avro_type) -> bool:
    if isinstance(avro_type, list):
        return any(_is_nullable(branch) for branch in avro_type)
    if isinstance(avro_type, dict):
        return _is_nullable(avro_type["type"]) if isinstance(avro_type["type"], (dict, list)) \
            else avro_type["type"] == "null"
    return avro_type == "null"


def _make_nullable(field: dict) -> None:
    branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
    field["type"] = ["null", *[b for b in branches if b != "null"]]
    field["default"] = None


def _record_in(avro_type) -> dict | None:
    """The record a field's type holds (directly, in a union, or as array items), as a definition; None for a
    reference by name (defined, and widened, where it first appears) or any other type."""
    for candidate in avro_type if isinstance(avro_type, list) else [avro_type]:
        if not isinstance(candidate, dict):
            continue
        kind = candidate["type"]
        if isinstance(kind, (dict, list)):
            return _record_in(kind)
        if kind == "record":
            return candidate
        if kind == "array":
            return _record_in(candidate["items"])
    return None


def _widen_record(reader: dict, writer: dict) -> None:
    written = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        source = next((written[n] for n in [field["name"], *field.get("aliases", [])] if n in written), None)
        if source is None:
            if "default" not in field:
                _make_nullable(field)
            continue
        if _is_nullable(source["type"]) and not _is_nullable(field["type"]):
            _make_nullable(field)
        inner, inner_written = _record_in(field["type"]), _record_in(source["type"])
        if inner is not None and inner_written is not None:
            _widen_record(inner, inner_written)


def different_alerts(held: dict | str, offered: dict | str) -> str | None:
    """Why alerts of schema ``offered`` cannot share a topic with those of ``held`` (None when they can).

    They can when one, widened, reads the other: two versions of one survey's alerts.
    """
    held, offered = (json.loads(s) if isinstance(s, str) else s for s in (held, offered))
    share = _shared_share(offered, held)
    if share < SAME_FAMILY_SHARE:
        return f"they share {share:.0%} of their top-level fields"
    problems = read_problems(widened(offered, held), held)
    if problems and read_problems(widened(held, offered), offered):
        return f"neither reads the other ({problems[0]})"
    return None
