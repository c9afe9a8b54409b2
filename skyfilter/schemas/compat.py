"""Avro schema compatibility: can data written with one schema be read with another.

The rules are Avro's schema resolution (specification, "Schema Resolution"):
a reader field missing from the writer needs a default, numbers and strings
promote, a union reads what one of its branches reads, records match by their
unqualified name (Rubin's namespaces change with every version: ``lsst.v10_0``,
``lsst.v11_1``).  The registry uses it to enforce a subject's compatibility
level, as Confluent's registry does.
"""

from __future__ import annotations

from fastavro.schema import expand_schema

from skyfilter.schemas.avro import clean_schema

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
              "string": {"bytes"}, "bytes": {"string"}}


def read_problems(reader: dict | list | str, writer: dict | list | str) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty when it can)."""
    return _problems(_expanded(reader), _expanded(writer), "")


def compatibility_problems(level: str, new: dict | str, existing: list[dict | str]) -> list[str]:
    """Why ``new`` breaks a subject's compatibility ``level`` given its versions ``existing`` (oldest first)."""
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"unknown compatibility level '{level}' (one of {', '.join(LEVELS)})")
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    problems = []
    for index, old in enumerate(against):
        label = "the latest version" if len(against) == 1 else f"version {index + 1}"
        if level.startswith(("BACKWARD", "FULL")):
            problems += [f"cannot read data written with {label}: {p}" for p in read_problems(new, old)]
        if level.startswith(("FORWARD", "FULL")):
            problems += [f"{label} cannot read data written with it: {p}" for p in read_problems(old, new)]
    return problems


def _expanded(schema):
    import json

    if isinstance(schema, str):
        schema = json.loads(schema) if schema.lstrip()[:1] in "{[" else schema
    return expand_schema(clean_schema(schema))


def _kind(schema) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return schema["type"] if isinstance(schema["type"], str) else _kind(schema["type"])
    return schema


def _short_name(schema: dict) -> str:
    return schema["name"].rsplit(".", 1)[-1]


def _problems(reader, writer, path: str) -> list[str]:
    where = path or "the top level"
    if isinstance(writer, list):
        return [p for branch in writer for p in _problems(reader, branch, path)]
    if isinstance(reader, list):
        for branch in reader:
            if not _problems(branch, writer, path):
                return []
        return [f"{where}: no branch of the reader's union reads a {_kind(writer)}"]
    if isinstance(reader, dict) and isinstance(reader["type"], (dict, list)):
        return _problems(reader["type"], writer, path)
    if isinstance(writer, dict) and isinstance(writer["type"], (dict, list)):
        return _problems(reader, writer["type"], path)
    reader_kind, writer_kind = _kind(reader), _kind(writer)
    if reader_kind != writer_kind:
        if reader_kind in PROMOTIONS.get(writer_kind, ()):
            return []
        return [f"{where}: a {writer_kind} cannot be read as a {reader_kind}"]
    if reader_kind == "record":
        return _record_problems(reader, writer, path)
    if reader_kind == "enum":
        missing = sorted(set(writer["symbols"]) - set(reader["symbols"]))
        if missing and "default" not in reader:
            return [f"{where}: enum symbol(s) {', '.join(missing)} unknown to the reader"]
    if reader_kind == "array":
        return _problems(reader["items"], writer["items"], f"{path}[]")
    if reader_kind == "map":
        return _problems(reader["values"], writer["values"], f"{path}{{}}")
    if reader_kind == "fixed" and reader["size"] != writer["size"]:
        return [f"{where}: fixed size {writer['size']} cannot be read as size {reader['size']}"]
    return []


def _record_problems(reader: dict, writer: dict, path: str) -> list[str]:
    aliases = {a.rsplit(".", 1)[-1] for a in reader.get("aliases", [])}
    if _short_name(reader) != _short_name(writer) and _short_name(writer) not in aliases:
        return [f"{path or 'the top level'}: record {_short_name(writer)} cannot be read as {_short_name(reader)}"]
    written = {f["name"]: f for f in writer["fields"]}
    problems = []
    for field in reader["fields"]:
        names = [field["name"], *field.get("aliases", [])]
        source = next((written[n] for n in names if n in written), None)
        inner = f"{path}.{field['name']}" if path else field["name"]
        if source is None:
            if "default" not in field:
                problems.append(f"{inner}: not written and without a default")
            continue
        problems += _problems(field["type"], source["type"], inner)
    return problems
