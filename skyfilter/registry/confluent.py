"""An external Confluent-compatible schema registry (Confluent, Karapace, Rubin's), through confluent-kafka's client.

Used instead of the embedded registry when ``schema_registry.url`` (input) or
``schema_registry.output.url`` (broker topics) is set.  Credentials
(``basic_auth``, ``user:password``) go to the client and are never printed.
"""

from __future__ import annotations

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from skyfilter.core.errors import SkyfilterError
from skyfilter.registry.topic_store import other_alerts_error
from skyfilter.schemas.avro import fingerprint, schema_text

SUBJECT_NOT_FOUND = (40401, 40402, 40403)


class ConfluentRegistry:
    """A Confluent-compatible schema registry reached over HTTP."""

    def __init__(self, url: str, basic_auth: str | None = None, timeout_s: int = 30):
        self.url = url.rstrip("/")
        settings = {"url": self.url, "timeout": timeout_s, "cache.latest.ttl.sec": 5, "max.retries": 2}
        if basic_auth:
            settings["basic.auth.user.info"] = basic_auth
        self.client = SchemaRegistryClient(settings)
        self._version_ids: dict[tuple[str, int], int] = {}  # a subject's version never changes its schema

    def _call(self, what: str, call, *args):
        """Run a client call; None for "not found", one clear error line for anything else."""
        try:
            return call(*args)
        except SchemaRegistryError as exc:
            if exc.error_code in SUBJECT_NOT_FOUND or exc.http_status_code == 404:
                return None
            raise SkyfilterError(f"schema registry {self.url}: {what}: {exc.error_message} "
                                 f"(HTTP {exc.http_status_code})") from None
        except Exception as exc:  # the client raises the HTTP library's own errors when unreachable
            raise SkyfilterError(f"cannot reach schema registry {self.url}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]}") from None

    def register(self, subject: str, schema: dict | str, same_alerts: bool = False,
                 schema_id: int | None = None) -> int:
        """Register a schema under a subject; returns its id (see SchemaRegistry.register).

        A registry assigns its own ids: when ``schema_id`` is given and the registry's
        id differs, the messages that carry ``schema_id`` cannot be decoded through it.
        """
        text = schema_text(schema)
        if same_alerts:
            held = [(i, self.schema(i)) for i in self.versions(subject)]
            if held and fingerprint(text) not in {fingerprint(t) for _, t in held}:
                clash = other_alerts_error(subject, held, text)
                if clash is not None:
                    raise clash
        given = int(self._call(f"register under '{subject}'", self.client.register_schema, subject,
                               Schema(text, "AVRO")))
        if schema_id is not None and given != schema_id:
            raise SkyfilterError(f"schema registry {self.url} gave subject '{subject}' schema id {given}, but its "
                                 f"messages carry id {schema_id} (another registry's): use one registry for "
                                 f"input and output, or a format other than full")
        return given

    def schema(self, schema_id: int) -> str:
        """The schema JSON text for an id."""
        found = self._call(f"schema id {schema_id}", self.client.get_schema, schema_id)
        if found is None:
            raise SkyfilterError(f"schema id {schema_id} is not in the registry at {self.url}")
        return found.schema_str

    def latest(self, subject: str) -> tuple[int, str] | None:
        """The (id, schema text) most recently registered under a subject, or None."""
        found = self._call(f"latest version of '{subject}'", self.client.get_latest_version, subject)
        return None if found is None else (int(found.schema_id), found.schema.schema_str)

    def versions(self, subject: str) -> list[int]:
        """The schema ids of a subject's versions, oldest first; empty for an unknown subject."""
        numbers = self._call(f"versions of '{subject}'", self.client.get_versions, subject) or []
        for number in numbers:
            if (subject, number) not in self._version_ids:
                found = self._call(f"version {number} of '{subject}'", self.client.get_version, subject, number)
                if found is not None:
                    self._version_ids[subject, number] = int(found.schema_id)
        return [self._version_ids[subject, n] for n in sorted(numbers) if (subject, n) in self._version_ids]

    def delete(self, subject: str, version: int | None = None, permanent: bool = False) -> list[int]:
        """Delete one version of a subject (or all of them), soft or ``permanent``; returns the version numbers."""
        if version is None:
            return list(self._call(f"delete '{subject}'", self.client.delete_subject, subject, permanent))
        return [int(self._call(f"delete version {version} of '{subject}'", self.client.delete_version, subject,
                               version, permanent))]
