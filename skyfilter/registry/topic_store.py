"""The embedded schema registry: subjects, versions and schemas kept in one compacted Kafka topic.

Every producer, job and ``skyfilter registry serve`` on any machine reads the
same topic, so they all see one registry.  A schema's id is 31 bits of its
canonical fingerprint: two producers registering the same schema at once get
the same id without coordinating.  Keys in the topic:

* ``schema/<id>``: the schema text and fingerprint;
* ``subject/<subject>``: the subject's versions, oldest first: each a version number, a schema
  id and whether it was (soft) deleted.  Numbers never move: a deleted version leaves a gap,
  as in Confluent's registry;
* ``config/<subject>`` and ``config/``: a subject's and the global compatibility level.
"""

from __future__ import annotations

import json
import uuid
import weakref

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.read_back import watermarks
from skyfilter.kafka.topics import ensure_topics
from skyfilter.schemas.avro import fingerprint, schema_text
from skyfilter.schemas.compat import LEVELS, compatibility_problems
from skyfilter.schemas.reader import different_alerts, schema_name


class IncompatibleSchema(SkyfilterError):
    """A schema that breaks its subject's compatibility level (HTTP 409 in the REST API)."""


class RegistryNotFound(SkyfilterError):
    """A subject or version that is not there (or not in the state a delete needs): HTTP 404 in the REST API."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def other_alerts_error(subject: str, versions: list[tuple[int, str]], offered: str) -> SkyfilterError | None:
    """The error of a schema offered to a topic of other alerts (None for a version of the alerts of any of the
    subject's ``versions`` ``(id, text)``, oldest first: one bad version must not refuse every later one)."""
    problems = [different_alerts(text, offered) for _, text in versions]
    if None in problems:
        return None
    held, problem = versions[-1], problems[-1]
    topic = subject.removesuffix("-value")
    return SkyfilterError(f"topic '{topic}' carries alerts of schema id {held[0]} ({schema_name(held[1])}); these "
                          f"({schema_name(offered)}) are not a version of them: {problem}; produce them to "
                          f"another topic")


class KafkaTopicRegistry:
    """A registry kept in a compacted, single-partition Kafka topic."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.bootstrap = cfg.bootstrap_servers
        self.topic = cfg.schema_registry.topic
        self.default_level = cfg.schema_registry.compatibility.upper()
        ensure_topics(cfg, {self.topic: 1}, {"cleanup.policy": "compact"})
        self._entries: dict[str, dict] = {}
        self._read_to = 0
        self._consumer: Consumer | None = None  # opened on the first read, kept for the later ones

    def _reader(self) -> Consumer:
        """This registry's consumer of the topic: a stream looks before every batch, and opening one costs more
        than the look.  Closed when the registry goes away."""
        if self._consumer is None:
            self._consumer = Consumer(client_settings(self.cfg, **{
                "group.id": f"skyfilter-registry-{uuid.uuid4()}", "enable.auto.commit": False, "log_level": 0,
                "fetch.wait.max.ms": 10}))  # a fetch left waiting at the broker would hold up the next look
            weakref.finalize(self, self._consumer.close)
        return self._consumer

    @staticmethod
    def schema_id_for(schema: dict | str) -> int:
        """The id a schema gets here: 31 bits of its canonical fingerprint."""
        return int(fingerprint(schema)[:8], 16) & 0x7FFFFFFF

    def refresh(self) -> None:
        """Read what was written to the topic since the last refresh (by anyone)."""
        consumer = self._reader()
        try:
            low, high = watermarks(consumer, TopicPartition(self.topic, 0))
            position = max(low, self._read_to)
            if high <= position:
                return
            consumer.assign([TopicPartition(self.topic, 0, position)])
            while position < high:
                message = consumer.poll(10)
                if message is None:
                    raise SkyfilterError(f"schema registry topic '{self.topic}' did not answer")
                if message.error():
                    raise SkyfilterError(f"schema registry topic '{self.topic}': {message.error().str()}")
                position = message.offset() + 1
                if message.value() is not None:
                    self._entries[message.key().decode()] = json.loads(message.value())
            self._read_to = position
            consumer.unassign()  # an assigned partition keeps a fetch waiting at the broker: the next look would wait
        except KafkaException as exc:
            raise SkyfilterError(f"cannot read schema registry topic '{self.topic}' at {self.bootstrap}: "
                                 f"{exc.args[0].str()}") from None

    def _write(self, entries: dict[str, dict]) -> None:
        producer = Producer(client_settings(self.cfg, acks="all", log_level=0, **{"enable.idempotence": True}))
        for key, value in entries.items():
            producer.produce(self.topic, key=key.encode(), value=json.dumps(value).encode())
        if producer.flush(30) != 0:
            raise SkyfilterError(f"could not write to schema registry topic '{self.topic}' at {self.bootstrap}")
        self._entries.update(entries)

    def _records(self, subject: str) -> list[dict]:
        """Every version a subject keeps, deleted ones included: ``{"version", "id", "deleted"}``, oldest first."""
        bound = self._entries.get(f"subject/{subject}")
        if bound is None:
            return []
        if "records" in bound:
            return [dict(r) for r in bound["records"]]
        ids = bound.get("versions") or [bound["id"]]  # entries of earlier releases: ids alone, numbered in order
        return [{"version": n, "id": i, "deleted": False} for n, i in enumerate(ids, start=1)]

    def _ids(self, subject: str) -> list[int]:
        return [r["id"] for r in self._records(subject) if not r["deleted"]]

    @staticmethod
    def _subject_entry(subject: str, records: list[dict]) -> dict:
        live = [r["id"] for r in records if not r["deleted"]]
        return {"subject": subject, "id": live[-1] if live else None, "versions": live, "records": records}

    def register(self, subject: str, schema: dict | str, same_alerts: bool = False,
                 schema_id: int | None = None) -> int:
        """Register a schema under a subject (a new version unless it is there already); returns its id.

        With ``same_alerts`` (an input topic), a new version must be a version of the
        alerts the subject already holds (``skyfilter/schemas/reader.py``).  A new
        version must meet the subject's compatibility level.  ``schema_id`` keeps the
        id another registry gave the schema (a ``full`` broker topic resends input
        messages, whose bytes carry the input registry's id).
        """
        text = schema_text(schema)
        schema_id = self.schema_id_for(text) if schema_id is None else schema_id
        self.refresh()
        stored = self._entries.get(f"schema/{schema_id}")
        if stored and stored["fingerprint"] != fingerprint(text):
            raise SkyfilterError(f"schema id {schema_id} already names a different schema (fingerprint clash)")
        ids = self._ids(subject)
        if same_alerts and ids and schema_id not in ids:
            clash = other_alerts_error(subject, [(i, self.schema(i)) for i in ids], text)
            if clash is not None:
                raise clash
        updates = {}
        if not stored:
            updates[f"schema/{schema_id}"] = {"id": schema_id, "fingerprint": fingerprint(text), "schema": text}
        if schema_id not in ids:
            problems = compatibility_problems(self.compatibility(subject), text, [self.schema(i) for i in ids])
            if problems:
                raise IncompatibleSchema(f"schema for subject '{subject}' is not {self.compatibility(subject)} "
                                         f"compatible: {problems[0]}"
                                         + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            records = [r for r in self._records(subject) if r["id"] != schema_id]  # a deleted one comes back anew
            number = max((r["version"] for r in self._records(subject)), default=0) + 1
            updates[f"subject/{subject}"] = self._subject_entry(
                subject, records + [{"version": number, "id": schema_id, "deleted": False}])
        if updates:
            self._write(updates)
        return schema_id

    def schema(self, schema_id: int) -> str:
        """The schema JSON text for an id."""
        key = f"schema/{schema_id}"
        if key not in self._entries:
            self.refresh()
        if key not in self._entries:
            raise SkyfilterError(f"schema id {schema_id} is not in the registry topic '{self.topic}'")
        return self._entries[key]["schema"]

    def has_schema(self, schema_id: int) -> bool:
        """Whether an id names a schema here."""
        try:
            self.schema(schema_id)
        except SkyfilterError:
            return False
        return True

    def latest(self, subject: str) -> tuple[int, str] | None:
        """The (id, schema text) most recently registered under a subject, or None."""
        self.refresh()
        ids = self._ids(subject)
        return None if not ids else (ids[-1], self.schema(ids[-1]))

    def subjects(self, deleted: bool = False) -> list[str]:
        """Every subject with a live version (``deleted``: with any version kept), sorted."""
        self.refresh()
        return sorted(subject for subject in (key.removeprefix("subject/") for key in self._entries
                                              if key.startswith("subject/"))
                      if (self._records(subject) if deleted else self._ids(subject)))

    def numbered(self, subject: str, deleted: bool = False) -> list[tuple[int, int]]:
        """A subject's (version number, schema id) pairs, oldest first; soft-deleted ones too with ``deleted``."""
        self.refresh()
        return [(r["version"], r["id"]) for r in self._records(subject) if deleted or not r["deleted"]]

    def delete(self, subject: str, version: int | None = None, permanent: bool = False) -> list[int]:
        """Delete one version of a subject (or, without ``version``, all of them); returns the version numbers.

        A soft delete hides the version from the subject, as Confluent's registry
        does: producers can no longer register against it, and a stream no longer
        reads alerts of it (they become dead letters).  The schema keeps its id, so
        messages already written still decode by id.  ``permanent`` removes a version
        soft-deleted before.
        """
        self.refresh()
        records = self._records(subject)
        if not records:
            raise RegistryNotFound(40401, f"Subject '{subject}' not found.")
        chosen = [r for r in records if version is None or r["version"] == version]
        if not chosen:
            raise RegistryNotFound(40402, f"Version {version} not found.")
        if permanent:
            live = [r["version"] for r in chosen if not r["deleted"]]
            if live:
                raise RegistryNotFound(40405 if version is None else 40407,
                                       f"Subject '{subject}' Version {live[0]} was not deleted first before "
                                       f"being permanently deleted")
            kept = [r for r in records if r not in chosen]
        else:
            if all(r["deleted"] for r in chosen):
                raise RegistryNotFound(40404 if version is None else 40406,
                                       f"Subject '{subject}' Version {chosen[0]['version']} was soft deleted. "
                                       f"Set permanent=true to delete permanently")
            kept = [dict(r, deleted=True) if r in chosen else r for r in records]
        self._write({f"subject/{subject}": self._subject_entry(subject, kept)})
        return [r["version"] for r in chosen]

    def listing(self) -> list[str]:
        """One line per subject (versions, schema ids, compatibility), then a count: `skyfilter registry list`."""
        subjects = self.subjects()
        lines = [f"{subject}: {len(self._ids(subject))} version(s), schema ids "
                 f"{', '.join(map(str, self._ids(subject)))}; compatibility {self.compatibility(subject)}"
                 + (f"; {gone} soft-deleted" if (gone := len(self._records(subject)) - len(self._ids(subject)))
                    else "")
                 for subject in subjects]
        return lines + [f"{len(subjects)} subject(s) in topic '{self.topic}' at {self.bootstrap}"]

    def versions(self, subject: str) -> list[int]:
        """The schema ids of a subject's versions, oldest (version 1) first; empty for an unknown subject."""
        self.refresh()
        return self._ids(subject)

    def subjects_of(self, schema_id: int) -> list[tuple[str, int]]:
        """The (subject, version) pairs that hold a schema id."""
        return [(subject, number) for subject in self.subjects()  # subjects() has just read the topic
                for number, held in self.numbered(subject) if held == schema_id]

    def compatibility(self, subject: str | None = None) -> str:
        """A subject's compatibility level (its own, else the global one)."""
        own = self._entries.get(f"config/{subject}") if subject else None
        default = self._entries.get("config/", {}).get("compatibilityLevel", self.default_level)
        return (own or {}).get("compatibilityLevel", default)

    def own_compatibility(self, subject: str) -> str | None:
        """The level set on a subject itself (None when it follows the global one)."""
        self.refresh()
        return (self._entries.get(f"config/{subject}") or {}).get("compatibilityLevel")

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        """Set a subject's (or, without one, the global) compatibility level."""
        level = level.upper()
        if level not in LEVELS:
            raise SkyfilterError(f"unknown compatibility level '{level}' (one of {', '.join(LEVELS)})")
        self._write({f"config/{subject or ''}": {"compatibilityLevel": level}})
        return level

    def forget_compatibility(self, subject: str) -> None:
        """Let a subject follow the global compatibility level again."""
        self._write({f"config/{subject}": {}})
