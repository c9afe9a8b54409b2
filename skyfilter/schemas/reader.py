"""One reader schema for all the writer schemas an input topic carries.

Surveys move their alert schema on during a season (Rubin went 7.4 -> 9.0 ->
10.0 -> 11.0 -> 11.1 in two years), and a topic then holds alerts of several
versions.  The stream reads each alert with its own writer schema, resolved
onto one *reader* schema, so that filters see one set of columns.

The reader is *chosen* by walking the versions in the order they were
registered (:func:`admit`), so that no version can poison it:

* the first version of the topic's family (Rubin, ZTF, ...) starts the reader;
* a newer version of the family takes over when it, *widened*, still reads
  every version read so far (a field another version may leave null, or does
  not have, becomes nullable with a null default: Rubin 11.0 made
  ``diaSource.psfNdata`` non-null, so 10.0 data with a null there needs it);
* any other version is read by the current reader, widened over it, when
  Avro's resolution allows (an older version produced late);
* a version that resolves neither way (a field's type changed, another
  survey's alerts) is left out with the reason, and its alerts become dead
  letters.  It never becomes part of the reader, at start or later.

``stream.reader_schema`` pins the reader instead: then versions are only ever
read by it (widened), never take over.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

from skyfilter.schemas.avro import clean_schema
from skyfilter.schemas.compat import read_problems

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


@dataclass(frozen=True)
class Admission:
    """What the reader becomes when one more writer version is offered to it."""

    reader: dict
    took_over: bool = False  # the offered version is the reader from now on (widened)
    widened: bool = False  # the reader was widened to read the offered version
    problem: str | None = None  # why the offered version cannot be read (the reader is unchanged)


def admit(reader: dict | None, readable: list[dict], schema_id: int, writer: dict | str,
          may_take_over: bool = True, needs_columns: bool = False) -> Admission:
    """Offer writer version ``schema_id`` to the ``reader`` that reads the versions ``readable`` (None: the first).

    ``may_take_over`` is false for a pinned reader.  ``needs_columns``: a newer
    version takes over only if it keeps every column of the reader (a running
    stream's filters keep their columns; it takes over at the next start).
    """
    writer = json.loads(writer) if isinstance(writer, str) else clean_schema(writer)
    if reader is None:
        return Admission(clean_schema(writer), took_over=True)
    if family(writer) != family(reader):
        return Admission(reader, problem=f"schema id {schema_id} ({schema_name(writer)}) holds {family(writer)} "
                                         f"alerts; this stream reads {family(reader)} alerts")
    if may_take_over and _newer(writer, reader) and (not needs_columns or covers(writer, reader)):
        candidate = clean_schema(writer)
        for older in readable:
            candidate = widened(candidate, older)
        if all(not read_problems(candidate, older) for older in readable):
            return Admission(candidate, took_over=True)
    candidate = widened(reader, writer)
    problem = reading_problem(candidate, schema_id, writer)
    if problem is not None:
        return Admission(reader, problem=problem)
    return Admission(candidate, widened=schema_text_of(candidate) != schema_text_of(reader))


def reader_for(writers: list[tuple[int, dict]], pinned: dict | None = None) -> tuple[dict, dict[int, str]]:
    """The reader schema of a topic's writers ``(id, schema)`` in the order they were registered, and the reason
    for each one left out (see the module's docstring)."""
    reader, _, unreadable = choose_reader(writers, pinned)
    return reader, unreadable


def choose_reader(writers: list[tuple[int, dict]], pinned: dict | None = None
                  ) -> tuple[dict, int | None, dict[int, str]]:
    """``(reader, the id it was made from (None when pinned), {id left out: why})`` of writers in registration
    order."""
    if not writers and pinned is None:
        raise ValueError("no writer schema")
    reader = None if pinned is None else clean_schema(pinned)
    reader_id = None
    readable: list[dict] = []
    unreadable: dict[int, str] = {}
    for schema_id, writer in writers:
        admission = admit(reader, readable, schema_id, writer, may_take_over=pinned is None)
        if admission.problem is None:
            reader = admission.reader
            reader_id = schema_id if admission.took_over else reader_id
            readable.append(writer)
        else:
            unreadable[schema_id] = admission.problem
    return reader, reader_id, unreadable


def family(schema: dict | str) -> str:
    """Which survey's alerts a schema holds: Rubin for ``lsst.*``, ZTF for ``ztf.*``, else its first name part."""
    first = schema_name(schema).split(".")[0].lower()
    return {"lsst": "Rubin", "ztf": "ZTF"}.get(first, first)


def covers(new: dict, old: dict) -> bool:
    """Whether schema ``new`` has every field (nested records too) of ``old``: filters of ``old`` still resolve."""
    from fastavro.schema import expand_schema

    return _covers(expand_schema(clean_schema(new)), expand_schema(clean_schema(old)))


def schema_text_of(schema: dict) -> str:
    """A canonical text of a schema (to compare two readers)."""
    return json.dumps(schema, sort_keys=True)


def _version(schema: dict) -> tuple[int, ...] | None:
    found = re.search(r"v(\d+)_(\d+)", schema_name(schema))
    return (int(found.group(1)), int(found.group(2))) if found else None


def _newer(writer: dict, reader: dict) -> bool:
    """Versions named in the namespace (Rubin's ``lsst.v11_1``) are compared; others count as newer when
    registered later."""
    ours, theirs = _version(writer), _version(reader)
    return ours is None or theirs is None or ours > theirs


def _covers(new: dict, old: dict) -> bool:
    fields = {f["name"]: f for f in new["fields"]}
    for field in old["fields"]:
        match = fields.get(field["name"])
        if match is None:
            return False
        inner_old, inner_new = _record_in(field["type"]), _record_in(match["type"])
        if inner_old is not None and (inner_new is None or not _covers(inner_new, inner_old)):
            return False
    return True


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
