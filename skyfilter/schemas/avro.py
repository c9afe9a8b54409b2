"""Avro schemas: Rubin's from lsst-alert-packet, any other from the container files it comes in.

Also the pieces of schema knowledge the stream needs: fingerprints, the
cutout fields, and the reduced ``nocutouts`` schema.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import fastavro
from fastavro.schema import expand_schema, parse_schema, to_parsing_canonical_form

from skyfilter.core.errors import SkyfilterError


def clean_schema(definition: dict) -> dict:
    """A plain Avro JSON schema: fastavro's private ``__*`` keys removed."""
    if isinstance(definition, dict):
        return {k: clean_schema(v) for k, v in definition.items() if not k.startswith("__")}
    if isinstance(definition, list):
        return [clean_schema(v) for v in definition]
    return definition


def schema_text(definition: dict | str) -> str:
    """The JSON text of a schema, as registered and as given to Spark's from_avro."""
    if isinstance(definition, str):
        return definition
    return json.dumps(clean_schema(definition), separators=(",", ":"))


def fingerprint(definition: dict | str) -> str:
    """SHA-256 of the schema's Parsing Canonical Form: equal for equivalent schemas."""
    parsed = parse_schema(json.loads(definition) if isinstance(definition, str) else clean_schema(definition),
                          _write_hint=False)
    return hashlib.sha256(to_parsing_canonical_form(parsed).encode()).hexdigest()


def rubin_versions() -> list[str]:
    """Every Rubin alert schema version lsst-alert-packet ships (``MAJOR.MINOR``), oldest first."""
    from lsst.alert.packet.schema import get_schema_root

    found = []
    for major in Path(get_schema_root()).iterdir():
        if major.name.isdigit():
            found += [(int(major.name), int(minor.name)) for minor in major.iterdir() if minor.name.isdigit()
                      and list(minor.glob("lsst.v*.alert.avsc"))]
    return [f"{major}.{minor}" for major, minor in sorted(found)]


def rubin_schema(version: str) -> dict:
    """The Rubin alert schema ``MAJOR.MINOR`` (or ``latest``) packaged by lsst-alert-packet."""
    from lsst.alert.packet.schema import get_schema_path

    if str(version) == "latest":
        version = rubin_versions()[-1]
    try:
        major, minor = (int(x) for x in str(version).split("."))
        folder = Path(get_schema_path(major, minor))
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise SkyfilterError(f"unknown Rubin alert schema version '{version}': {exc}") from None
    files = list(folder.glob("lsst.v*.alert.avsc"))
    if not files:
        raise SkyfilterError(f"lsst-alert-packet has no alert schema in {folder}")
    return clean_schema(fastavro.schema.load_schema(str(files[0])))


PRIMITIVE_BLANKS = {"null": None, "boolean": False, "int": 0, "long": 0, "float": 0.0, "double": 0.0,
                    "string": "", "bytes": b""}


def blank_value(schema_type, filled: bool = False):
    """A value valid for an Avro type (named types written out in full), zero-like.

    Nullable fields are null, and arrays and maps empty, unless ``filled``: then every
    field holds a value and every array one item, so that decoding the record touches
    every field of the schema (what a warm-up needs).
    """
    if isinstance(schema_type, list):
        present = [t for t in schema_type if t != "null"]
        if "null" in schema_type and (not filled or not present):
            return None
        return blank_value(present[0] if present else schema_type[0], filled)
    if isinstance(schema_type, dict):
        kind = schema_type["type"]
        if kind == "record":
            return {f["name"]: blank_value(f["type"], filled) for f in schema_type["fields"]}
        if kind == "array":
            return [blank_value(schema_type["items"], filled)] if filled else []
        if kind == "map":
            return {"key": blank_value(schema_type["values"], filled)} if filled else {}
        if kind == "enum":
            return schema_type["symbols"][0]
        if kind == "fixed":
            return b"\0" * schema_type["size"]
        return blank_value(kind, filled)
    return PRIMITIVE_BLANKS[schema_type]


def filled_record(definition: dict) -> dict:
    """A record of the schema with every field present and every array one item long."""
    return blank_value(expand_schema(clean_schema(definition)), filled=True)


def schemaless_body(definition: dict, record: dict) -> bytes:
    """The Avro binary encoding of one record (no container, no wire-format header)."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parse_schema(clean_schema(definition), _write_hint=False), record)
    return buffer.getvalue()


def cutout_fields(definition: dict) -> list[str]:
    """Top-level fields holding image stamps (named ``cutout*`` in Rubin and ZTF schemas)."""
    return [f["name"] for f in definition["fields"] if f["name"].lower().startswith("cutout")]


def only_paths(definition: dict, paths: list[str]) -> dict:
    """A reader schema of ``definition`` (a record) keeping only the fields on these dotted paths, nested records
    pruned the same way (a record inside a union too); names unchanged, so Avro resolution accepts it and skips
    every other field of the writer's records.  Falls back to ``definition`` when the pruned schema does not
    stand on its own (a kept field referring to a named type defined in a dropped one)."""
    wanted: dict[str, list[str]] = {}
    for path in paths:
        head, _, rest = path.partition(".")
        wanted.setdefault(head, []).append(rest)
    fields = []
    for field in definition["fields"]:
        if field["name"] not in wanted:
            continue
        inner = [rest for rest in wanted[field["name"]] if rest]
        fields.append({**field, "type": _pruned_type(field["type"], inner)} if inner else field)
    pruned = {**definition, "fields": fields}
    try:
        parse_schema(clean_schema(pruned), _write_hint=False)
    except Exception:  # noqa: BLE001 - fastavro's SchemaParseException and friends: the whole reader then
        return definition
    return pruned


def _pruned_type(avro_type, paths: list[str]):
    if isinstance(avro_type, dict) and avro_type.get("type") == "record":
        return only_paths(avro_type, paths)
    if isinstance(avro_type, list):
        return [_pruned_type(member, paths) for member in avro_type]
    return avro_type


def without_fields(definition: dict, names: list[str], suffix: str | None = "nocutouts") -> dict:
    """A copy of a record schema without some top-level fields, under a distinct name.

    ``suffix=None`` keeps the record's name: an Avro *reader* schema must be
    named like the writer's for schema resolution to accept it.
    """
    reduced = copy.deepcopy(clean_schema(definition))
    reduced["fields"] = [f for f in reduced["fields"] if f["name"] not in set(names)]
    if suffix:
        reduced["name"] = f"{reduced['name']}_{suffix}"
    return reduced


class ContainerRecord:
    """One record of an Avro container file: its exact bytes and its decoded value."""

    __slots__ = ("body", "record")

    def __init__(self, body: bytes, record: dict):
        self.body = body
        self.record = record


def read_container(path: str | Path) -> tuple[dict, Iterator[ContainerRecord]]:
    """The writer schema of an Avro container file and its records, bytes kept as written.

    Records inside a block are concatenated without delimiters, so each is
    decoded once to find where it ends; the bytes handed back are the file's own.
    """
    path = Path(path)
    handle = open(path, "rb")  # noqa: SIM115 - closed by the generator below
    try:
        blocks = fastavro.block_reader(handle)
        schema = clean_schema(blocks.writer_schema)
    except Exception as exc:  # noqa: BLE001 - any failure here means "not an Avro file"
        handle.close()
        raise SkyfilterError(f"{path}: not a readable Avro container file ({exc})") from None
    parsed = parse_schema(schema, _write_hint=False)

    def records() -> Iterator[ContainerRecord]:
        with handle:
            for block in blocks:
                data = block.bytes_.getvalue() if isinstance(block.bytes_, io.BytesIO) else bytes(block.bytes_)
                stream = io.BytesIO(data)
                for _ in range(block.num_records):
                    start = stream.tell()
                    record = fastavro.schemaless_reader(stream, parsed, None)
                    yield ContainerRecord(data[start:stream.tell()], record)

    return schema, records()


def schema_file(path: str | Path) -> dict:
    """The schema a file holds: an Avro schema (``.avsc``, JSON), or the writer schema of an Avro container file
    (alerts as surveys publish them)."""
    path = Path(path)
    if path.suffix == ".avsc":
        try:
            return clean_schema(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise SkyfilterError(f"{path}: not an Avro schema file: {str(exc).splitlines()[0]}") from None
    return read_container(path)[0]


def avro_files(paths: list[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of Avro files they name."""
    found: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            found.extend(sorted(p for p in item.rglob("*.avro") if p.is_file()))
        elif item.is_file():
            found.append(item)
        else:
            raise SkyfilterError(f"no such file or folder: {item}")
    if not found:
        raise SkyfilterError(f"no .avro files in {', '.join(map(str, paths))}")
    return found
