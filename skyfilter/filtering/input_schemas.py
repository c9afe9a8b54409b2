"""The writer schemas of the stream's input topic, and the one reader schema filters see them as.

A topic may carry several schema versions (a survey moves its schema on mid
season).  Each alert's wire-format header names its writer schema; the
stream decodes it with that schema, resolved onto one reader schema, so
filters, outputs and the archive see one set of columns whatever the version.

The reader is chosen by a policy (``skyfilter/schemas/reader.py``): the
topic's family, walked in registration order, or ``stream.reader_schema``
pinned.  While the stream runs, the lanes look for versions registered since
(:class:`InputWatch`) and offer each to the reader the same way: a readable
one is decoded from then on, without a restart (a newer version that keeps
every column becomes the reader, and the outputs follow it); one that cannot
be read is dead-lettered with the reason, now and after every restart.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import clean_schema, fingerprint
from skyfilter.schemas.reader import admit, choose_reader, family, schema_name

logger = logging.getLogger(__name__)

# A Real-time Mode query, which cannot look at the registry between records, stops on an id it does not know
# with an error carrying this text; the lane then reads the registry and starts again (skyfilter/delivery/realtime.py).
NEW_SCHEMA_ERROR = "skyfilter: new input schema id"


@dataclass(frozen=True)
class InputSchemas:
    """The writer schemas known for an input topic and the reader schema they are decoded as."""

    topic: str
    reader: dict  # cutouts included; the lanes leave them out where they do not need them
    readable: dict[int, str] = field(default_factory=dict)  # writer id -> schema text, in registration order
    unreadable: dict[int, str] = field(default_factory=dict)  # id -> why the reader cannot read it
    missing: dict[int, str] = field(default_factory=dict)  # ids seen in messages but not registered, -> reason
    reader_id: int | None = None  # the version the reader was made from (None: pinned by stream.reader_schema)
    pinned: bool = False

    @property
    def known(self) -> set[int]:
        """Every id the stream has settled: decoded or dead-lettered with a reason."""
        return set(self.readable) | set(self.unreadable) | set(self.missing)

    @property
    def reasons(self) -> dict[int, str]:
        """Why each id the stream does not decode is a dead letter."""
        return {**self.missing, **self.unreadable}

    def with_writers(self, found: dict[int, str], running: bool = True) -> InputSchemas:
        """These schemas plus newly found writers ``id -> text``, in registration order, each offered to the reader.

        ``running``: a newer version takes over as the reader only if it keeps every column filters may use;
        otherwise the reader reads it, and it takes over at the next start.
        """
        reader, reader_id = self.reader, self.reader_id
        readable, unreadable = dict(self.readable), dict(self.unreadable)
        missing = {i: why for i, why in self.missing.items() if i not in found}
        for schema_id, text in found.items():
            writers = [json.loads(t) for t in readable.values()]
            admission = admit(reader, writers, schema_id, text, may_take_over=not self.pinned,
                              needs_columns=running)
            if admission.problem is None:
                reader, readable[schema_id] = admission.reader, text
                reader_id = schema_id if admission.took_over else reader_id
                continue
            later = running and not self.pinned and admit(reader, writers, schema_id, text).took_over
            unreadable[schema_id] = admission.problem + (
                "; the stream takes it as its reader at its next start and re-drives these dead letters"
                if later else "")
        return replace(self, reader=reader, reader_id=reader_id, readable=readable, unreadable=unreadable,
                       missing=missing)

    def not_registered(self, ids: list[int]) -> InputSchemas:
        """These schemas with ``ids`` noted as not registered for the topic (their alerts become dead letters,
        until the id is registered)."""
        reasons = {i: f"schema id {i} is not registered for topic '{self.topic}' (subject "
                      f"'{subject_for(self.topic)}')" for i in ids if i not in self.known}
        return replace(self, missing={**self.missing, **reasons})


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
    return InputSchemas(topic, json.loads(text), {schema_id: text}, reader_id=schema_id)


def pinned_reader(cfg: Config) -> dict | None:
    """The reader ``stream.reader_schema`` pins: a schema file, or a schema id of the input registry; None for
    ``family`` (the default policy)."""
    choice = cfg.stream.reader_schema
    if choice in (None, "family"):
        return None
    if isinstance(choice, int) or str(choice).isdigit():
        return json.loads(open_registry(cfg).schema(int(choice)))
    path = Path(str(choice)) if Path(str(choice)).is_absolute() else cfg.path("stream.reader_schema")
    try:
        return clean_schema(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise SkyfilterError(f"stream.reader_schema: cannot read the Avro schema {path}: "
                             f"{str(exc).splitlines()[0]}") from None


def choose_inputs(topic: str, writers: dict[int, str], pinned: dict | None = None) -> InputSchemas:
    """The schemas of a topic whose writers ``id -> text`` were registered in this order, read by the reader
    the policy chooses (``pinned``, or the family's)."""
    reader, reader_id, unreadable = choose_reader([(i, json.loads(t)) for i, t in writers.items()], pinned)
    readable = {i: t for i, t in writers.items() if i not in unreadable}
    return InputSchemas(topic, reader, readable, unreadable, reader_id=reader_id, pinned=pinned is not None)


def registered_writers(cfg: Config, topic: str) -> dict[int, str]:
    """The live versions registered for ``topic`` in the input registry, ``id -> text``, in registration order."""
    registry = open_registry(cfg)
    return {i: registry.schema(i) for i in registry.versions(subject_for(topic))}


def load_input_schemas(cfg: Config, topic: str) -> InputSchemas:
    """The writers registered for ``topic`` and the reader ``stream.reader_schema`` chooses for them."""
    texts = registered_writers(cfg, topic)
    if not texts:
        raise SkyfilterError(f"no schema is registered for topic '{topic}'")
    return choose_inputs(topic, texts, pinned_reader(cfg))


def check_writer(cfg: Config, topic: str, text: str) -> tuple[str | None, bool, InputSchemas]:
    """Would the stream read alerts written with schema ``text``?  (None or why not; whether it would be the
    reader; the schemas the stream would then have, as from its next start.)"""
    texts = registered_writers(cfg, topic)
    offered = next((i for i, held in texts.items() if fingerprint(held) == fingerprint(text)), -1)
    pinned = pinned_reader(cfg)
    inputs = choose_inputs(topic, {**texts, offered: text}, pinned)
    return inputs.reasons.get(offered), inputs.reader_id == offered, inputs


class InputWatch:
    """Finds the versions registered for the input topic since the stream started (one registry read per check)."""

    def __init__(self, cfg: Config, who: str = "stream"):
        self.cfg = cfg
        self.who = who  # says in the log which lane found a version
        self.registry = None

    def check(self, schemas: InputSchemas, seen: list[int] | None = None) -> InputSchemas | None:
        """``schemas`` with the versions registered since, and the ``seen`` ids that are not registered at all
        noted as such; None when nothing is new."""
        if self.registry is None:
            self.registry = open_registry(self.cfg)
        try:
            ids = self.registry.versions(subject_for(schemas.topic))
            found = {i: self.registry.schema(i) for i in ids if i not in schemas.readable and
                     i not in schemas.unreadable}
        except SkyfilterError as exc:
            logger.info(f"{self.who}: input schemas: {exc}; the known versions stay in use")
            return None
        missing = [i for i in seen or [] if i not in schemas.known and i not in found]
        if not found and not missing:
            return None
        updated = schemas.with_writers(found).not_registered(missing)
        for schema_id in [*found, *missing]:
            if schema_id in updated.readable:
                how = (f"the reader from now on ({family(updated.reader)})" if updated.reader_id == schema_id
                       else "decoded from now on")
                logger.info(f"{self.who}: new input schema version, schema id {schema_id} "
                            f"({schema_name(found[schema_id])}): {how}")
            else:
                logger.warning(f"{self.who}: {updated.reasons[schema_id]}; its alerts go to the dead letters")
        return updated
