"""The writer schemas of the stream's input topic, and the one reader schema filters see them as.

A topic may carry several schema versions (a survey moves its schema on mid
season).  Each alert's wire-format header names its writer schema; the
stream decodes it with that schema, resolved onto one reader schema
(``skyfilter/core/reader_schema.py``), so filters, outputs and the archive see
one set of columns whatever the version.

The reader is fixed when the stream starts (the newest version, widened over
the older ones).  While it runs, the lanes look for new versions registered
under the topic's subject before each micro-batch (:class:`InputWatch`): a
version the reader can read is decoded from then on, without a restart; one
it cannot read is dead-lettered with the reason, until a restart adopts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from pyspark.sql import Column
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.reader_schema import reader_for, reading_problem, schema_name
from skyfilter.core.registry import open_registry, subject_for

# A Real-time Mode query, which cannot look at the registry between records, stops on an id it does not know
# with an error carrying this text; the lane then reads the registry and starts again (skyfilter/stream/realtime.py).
NEW_SCHEMA_ERROR = "skyfilter: new input schema id"


@dataclass(frozen=True)
class InputSchemas:
    """The writer schemas known for an input topic and the reader schema they are decoded as."""

    topic: str
    reader: dict  # cutouts included; the lanes leave them out where they do not need them
    readable: dict[int, str] = field(default_factory=dict)  # writer id -> schema text, oldest first
    unreadable: dict[int, str] = field(default_factory=dict)  # id -> why the reader cannot read it

    @property
    def known(self) -> set[int]:
        """Every id the stream has settled: decoded or dead-lettered with a reason."""
        return set(self.readable) | set(self.unreadable)

    def with_writers(self, found: dict[int, str]) -> InputSchemas:
        """These schemas plus newly found writers ``id -> text``, each decoded when the reader can read it."""
        readable, unreadable = dict(self.readable), dict(self.unreadable)
        for schema_id, text in found.items():
            problem = reading_problem(self.reader, schema_id, text)
            if problem is None:
                readable[schema_id] = text
            else:
                unreadable[schema_id] = problem + "; restarting the stream widens its reader to the newest version"
        return replace(self, readable=readable, unreadable=unreadable)

    def not_registered(self, ids: list[int]) -> InputSchemas:
        """These schemas with ``ids`` settled as not registered for the topic (their alerts become dead letters)."""
        reasons = {i: f"schema id {i} is not registered for topic '{self.topic}' (subject "
                      f"'{subject_for(self.topic)}')" for i in ids if i not in self.known}
        return replace(self, unreadable={**self.unreadable, **reasons})


def per_writer(schema_id: Column, values: dict[int, Column]) -> Column:
    """The value of each message's writer schema: ``values[id]`` for the id ``schema_id`` holds (null for others).

    A CASE evaluates only the branch a row takes, so each message pays for its own writer's value alone.
    """
    case = None
    for writer_id, value in values.items():
        case = F.when(schema_id == writer_id, value) if case is None else case.when(schema_id == writer_id, value)
    return case if case is not None else F.lit(None)


def single_schema(topic: str, schema_id: int, text: str) -> InputSchemas:
    """The schemas of a topic known to carry one writer schema (a file, a test, an archive of one version)."""
    return InputSchemas(topic, json.loads(text), {schema_id: text})


def load_input_schemas(cfg: Config, topic: str, newest: tuple[int, str]) -> InputSchemas:
    """The writers registered for ``topic`` up to ``newest``, and the reader: ``newest`` widened over the others."""
    registry = open_registry(cfg)
    ids = registry.versions(subject_for(topic))
    ids = ids[:ids.index(newest[0])] if newest[0] in ids else ids
    texts = {i: registry.schema(i) for i in ids} | {newest[0]: newest[1]}  # oldest first, newest last
    reader, unreadable = reader_for([(i, json.loads(text)) for i, text in texts.items()])
    return InputSchemas(topic, reader, {i: text for i, text in texts.items() if i not in unreadable}, unreadable)


class InputWatch:
    """Finds the versions registered for the input topic since the stream started (one registry read per check)."""

    def __init__(self, cfg: Config, log=print, who: str = "stream"):
        self.cfg = cfg
        self.log = log
        self.who = who  # says in the log which lane found a version
        self.registry = None

    def check(self, schemas: InputSchemas, seen: list[int] | None = None) -> InputSchemas | None:
        """``schemas`` with the versions registered since, and the ``seen`` ids that are not registered at all
        settled as such; None when nothing is new."""
        if self.registry is None:
            self.registry = open_registry(self.cfg)
        try:
            ids = self.registry.versions(subject_for(schemas.topic))
            found = {i: self.registry.schema(i) for i in ids if i not in schemas.known}
        except SkyfilterError as exc:
            self.log(f"{self.who}: input schemas: {exc}; the known versions stay in use")
            return None
        missing = [i for i in seen or [] if i not in schemas.known and i not in found]
        if not found and not missing:
            return None
        updated = schemas.with_writers(found).not_registered(missing)
        for schema_id in [*found, *missing]:
            if schema_id in updated.readable:
                self.log(f"{self.who}: new input schema version, schema id {schema_id} "
                         f"({schema_name(found[schema_id])}): decoded from now on")
            else:
                self.log(f"{self.who}: {updated.unreadable[schema_id]}; its alerts go to the dead letters")
        return updated
