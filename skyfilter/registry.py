"""Schema registry: where producers and jobs on any machine agree on schema ids.

Two implementations with one interface:

* :class:`KafkaTopicRegistry` (default): a compacted Kafka topic.  Ids are
  derived from the schema's canonical fingerprint, so two producers that
  register the same schema at once get the same id without coordinating.
* :class:`ConfluentRegistry`: any Confluent-compatible REST registry, used
  instead when ``schema_registry.url`` is set.

Subjects follow Confluent's TopicNameStrategy: ``<topic>-value``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from skyfilter.avro_schemas import fingerprint, schema_text
from skyfilter.config import Config
from skyfilter.errors import SkyfilterError
from skyfilter.kafka_clients import client_settings
from skyfilter.topics import ensure_topics


def subject_for(topic: str) -> str:
    """The registry subject of a topic's message values."""
    return f"{topic}-value"


class SchemaRegistry(Protocol):
    """What producers and jobs need from a registry."""

    def register(self, subject: str, schema: dict | str, exclusive: bool = False) -> int:
        """Register a schema under a subject; returns its id.

        With ``exclusive``, the subject may only ever hold this one schema
        (an input topic carries one schema).
        """

    def schema(self, schema_id: int) -> str:
        """The schema JSON text for an id."""

    def latest(self, subject: str) -> tuple[int, str] | None:
        """The (id, schema text) most recently registered under a subject, or None."""


def open_registry(cfg: Config) -> SchemaRegistry:
    """The registry the config names: a Confluent URL if set, else the Kafka topic."""
    url = cfg.get("schema_registry.url", None)
    if url:
        return ConfluentRegistry(str(url))
    return KafkaTopicRegistry(cfg)


def _exclusive_clash(subject: str, held: int, offered: int) -> SkyfilterError:
    topic = subject.removesuffix("-value")
    return SkyfilterError(
        f"topic '{topic}' already carries schema id {held}; these alerts have schema id {offered}: "
        f"one input topic carries one schema, so produce them to another topic")


def _watermarks(consumer: Consumer, partition: TopicPartition, wait_s: float = 15.0) -> tuple[int, int]:
    """Low and high offsets; on a cluster a just-created topic gets its leader known everywhere a moment later."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=10)
        except KafkaException as exc:
            error = exc.args[0]
            transient = error.retriable() or error.code() in (KafkaError._UNKNOWN_PARTITION,
                                                              KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                              KafkaError.NOT_LEADER_FOR_PARTITION,
                                                              KafkaError.LEADER_NOT_AVAILABLE)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class KafkaTopicRegistry:
    """A registry kept in a compacted, single-partition Kafka topic."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.bootstrap = cfg.bootstrap_servers
        self.topic = str(cfg.get("schema_registry.topic"))
        ensure_topics(cfg, {self.topic: 1}, {"cleanup.policy": "compact"})
        self._entries: dict[str, dict] = {}

    @staticmethod
    def schema_id_for(schema: dict | str) -> int:
        """The id a schema gets here: 31 bits of its canonical fingerprint."""
        return int(fingerprint(schema)[:8], 16) & 0x7FFFFFFF

    def _refresh(self) -> None:
        consumer = Consumer(client_settings(self.cfg, **{"group.id": f"skyfilter-registry-{uuid.uuid4()}",
                                                            "enable.auto.commit": False, "log_level": 0}))
        try:
            low, high = _watermarks(consumer, TopicPartition(self.topic, 0))
            if high <= low:
                return
            consumer.assign([TopicPartition(self.topic, 0, low)])
            position = low
            while position < high:
                message = consumer.poll(10)
                if message is None:
                    raise SkyfilterError(f"schema registry topic '{self.topic}' did not answer")
                if message.error():
                    raise SkyfilterError(f"schema registry topic '{self.topic}': {message.error().str()}")
                position = message.offset() + 1
                if message.value() is not None:
                    self._entries[message.key().decode()] = json.loads(message.value())
        except KafkaException as exc:
            raise SkyfilterError(f"cannot read schema registry topic '{self.topic}' at {self.bootstrap}: "
                                 f"{exc.args[0].str()}") from None
        finally:
            consumer.close()

    def _write(self, entries: dict[str, dict]) -> None:
        producer = Producer(client_settings(self.cfg, acks="all", log_level=0, **{"enable.idempotence": True}))
        for key, value in entries.items():
            producer.produce(self.topic, key=key.encode(), value=json.dumps(value).encode())
        if producer.flush(30) != 0:
            raise SkyfilterError(f"could not write to schema registry topic '{self.topic}' at {self.bootstrap}")
        self._entries.update(entries)

    def register(self, subject: str, schema: dict | str, exclusive: bool = False) -> int:
        text = schema_text(schema)
        schema_id = self.schema_id_for(text)
        self._refresh()
        stored = self._entries.get(f"schema/{schema_id}")
        if stored and stored["fingerprint"] != fingerprint(text):
            raise SkyfilterError(f"schema id {schema_id} already names a different schema (fingerprint clash)")
        bound = self._entries.get(f"subject/{subject}")
        if exclusive and bound and bound["id"] != schema_id:
            raise _exclusive_clash(subject, bound["id"], schema_id)
        updates = {}
        if not stored:
            updates[f"schema/{schema_id}"] = {"id": schema_id, "fingerprint": fingerprint(text), "schema": text}
        if not bound or bound["id"] != schema_id:
            updates[f"subject/{subject}"] = {"subject": subject, "id": schema_id}
        if updates:
            self._write(updates)
        return schema_id

    def schema(self, schema_id: int) -> str:
        key = f"schema/{schema_id}"
        if key not in self._entries:
            self._refresh()
        if key not in self._entries:
            raise SkyfilterError(f"schema id {schema_id} is not in the registry topic '{self.topic}'")
        return self._entries[key]["schema"]

    def latest(self, subject: str) -> tuple[int, str] | None:
        self._refresh()
        bound = self._entries.get(f"subject/{subject}")
        return None if bound is None else (bound["id"], self.schema(bound["id"]))


class ConfluentRegistry:
    """A Confluent-compatible schema registry reached over HTTP."""

    CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: dict | None = None) -> dict | None:
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Content-Type": self.CONTENT_TYPE, "Accept": self.CONTENT_TYPE},
            data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise SkyfilterError(f"schema registry {self.url}{path}: HTTP {exc.code} {exc.read()[:200]!r}") from None
        except urllib.error.URLError as exc:
            raise SkyfilterError(f"cannot reach schema registry {self.url}: {exc.reason}") from None

    def register(self, subject: str, schema: dict | str, exclusive: bool = False) -> int:
        text = schema_text(schema)
        if exclusive:
            current = self.latest(subject)
            if current and fingerprint(current[1]) != fingerprint(text):
                raise _exclusive_clash(subject, current[0], -1)
        answer = self._call("POST", f"/subjects/{subject}/versions", {"schema": text})
        return int(answer["id"])

    def schema(self, schema_id: int) -> str:
        answer = self._call("GET", f"/schemas/ids/{schema_id}")
        if answer is None:
            raise SkyfilterError(f"schema id {schema_id} is not in the registry at {self.url}")
        return answer["schema"]

    def latest(self, subject: str) -> tuple[int, str] | None:
        answer = self._call("GET", f"/subjects/{subject}/versions/latest")
        return None if answer is None else (int(answer["id"]), answer["schema"])
