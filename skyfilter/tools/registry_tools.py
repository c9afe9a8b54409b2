"""``skyfilter registry check`` and ``delete``: what an operator does when a schema version goes wrong.

``check`` answers before a producer registers a version: would the running
stream read alerts written with it (and as what)?  ``delete`` undoes a
version registered by mistake, Confluent's way: soft first, permanent after.
"""

from __future__ import annotations

from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.filtering.input_schemas import check_writer
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import schema_file, schema_text
from skyfilter.schemas.reader import family, schema_name


def check_schema_file(cfg: Config, path: Path, topic: str) -> tuple[str | None, str]:
    """(why the stream would not read it or None, one line for the console) for the schema in ``path`` (an
    ``.avsc`` file, or an Avro container file of alerts)."""
    text = schema_text(schema_file(path))
    problem, is_reader, inputs = check_writer(cfg, topic, text)
    if problem is not None:
        return problem, f"{path}: a stream on '{topic}' would dead-letter these alerts: {problem}"
    how = "it would be the reader" if is_reader else f"read as {schema_name(inputs.reader)}"
    return None, f"{path}: a stream on '{topic}' reads these alerts ({schema_name(text)}, {family(text)}): {how}"


def delete_versions(cfg: Config, target: str, version: int | None, permanent: bool) -> str:
    """Delete a version (or every version) of a topic's subject in the input registry; one line saying what."""
    subject = target if target.endswith(("-value", "-key")) else subject_for(target)
    registry = open_registry(cfg)
    before = dict(registry.numbered(subject)) if hasattr(registry, "numbered") else {}
    numbers = registry.delete(subject, version, permanent)
    how = "permanently deleted" if permanent else "soft-deleted (--permanent removes them for good)"
    ids = [str(before[n]) for n in numbers if n in before]
    return (f"{subject}: version(s) {', '.join(map(str, numbers))} {how}"
            + (f"; schema id(s) {', '.join(ids)} no longer read by streams on this topic" if ids else ""))
