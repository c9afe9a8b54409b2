"""Schema registry: where producers, jobs and consumers on any machine agree on schema ids.

Two implementations with one interface:

* :class:`KafkaTopicRegistry` (default, ``skyfilter/registry/topic_store.py``): a
  compacted Kafka topic, served to standard clients over Confluent's REST API
  by ``skyfilter registry serve`` (``skyfilter/registry/server.py``).
* :class:`ConfluentRegistry` (``skyfilter/registry/confluent.py``): any
  Confluent-compatible REST registry, used instead when ``schema_registry.url``
  (the input topic's) or ``schema_registry.output.url`` (the broker topics') is set.

Subjects follow Confluent's TopicNameStrategy: ``<topic>-value``.
"""

from __future__ import annotations

from typing import Protocol

from skyfilter.core.config import Config
from skyfilter.registry.confluent import ConfluentRegistry
from skyfilter.registry.topic_store import KafkaTopicRegistry

__all__ = ["ConfluentRegistry", "KafkaTopicRegistry", "SchemaRegistry", "open_registry", "subject_for"]


def subject_for(topic: str) -> str:
    """The registry subject of a topic's message values."""
    return f"{topic}-value"


class SchemaRegistry(Protocol):
    """What producers and jobs need from a registry."""

    def register(self, subject: str, schema: dict | str, same_alerts: bool = False,
                 schema_id: int | None = None) -> int:
        """Register a schema under a subject; returns its id.

        With ``same_alerts`` (an input topic), a new version must be a version of
        the alerts the subject holds: an input topic carries one survey's alerts.
        ``schema_id``: the id the messages already carry (given by another
        registry), kept where the registry can.
        """

    def schema(self, schema_id: int) -> str:
        """The schema JSON text for an id."""

    def latest(self, subject: str) -> tuple[int, str] | None:
        """The (id, schema text) most recently registered under a subject, or None."""

    def versions(self, subject: str) -> list[int]:
        """The schema ids of a subject's versions, oldest first (what the stream watches for new ones)."""

    def delete(self, subject: str, version: int | None = None, permanent: bool = False) -> list[int]:
        """Delete one version of a subject, or all of them: soft first, then ``permanent``; the version numbers."""


def open_registry(cfg: Config, output: bool = False) -> SchemaRegistry:
    """The registry of the input topics, or (``output``) of the broker topics skyfilter writes.

    A URL in the config selects an external registry (``schema_registry.url`` for the
    input, ``schema_registry.output.url`` for the outputs: Rubin's registry is read-only);
    without one, the embedded registry in the Kafka topic ``schema_registry.topic``.
    """
    section = "schema_registry.output" if output else "schema_registry"
    url = cfg.get(f"{section}.url", None)
    if url:
        return ConfluentRegistry(str(url), cfg.get(f"{section}.basic_auth", None))
    return KafkaTopicRegistry(cfg)
