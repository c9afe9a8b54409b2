"""``skyfilter registry serve``: the embedded registry over the Confluent Schema Registry REST API.

What standard clients call (confluent-kafka's ``SchemaRegistryClient``,
``AvroSerializer`` and ``AvroDeserializer``, fink-client, Java serdes): schemas
by id, subjects and their versions, registration with the subject's
compatibility level enforced, lookup, compatibility tests, subject-level and
global ``/config``, and deleting versions and subjects (soft, then with
``?permanent=true``).  The data stays in the compacted Kafka topic, so any
number of servers on any machines answer alike.  A deleted version's schema
keeps its id: messages written with it still decode by id.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from fastavro.schema import parse_schema

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.registry.topic_store import IncompatibleSchema, KafkaTopicRegistry, RegistryNotFound
from skyfilter.schemas.avro import fingerprint, schema_text
from skyfilter.schemas.compat import LEVELS, compatibility_problems

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(Exception):
    """An answer in Confluent's error format: HTTP status, error code, message."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


class RegistryApi:
    """The REST API's answers, as plain functions of (method, path, body) over one registry."""

    def __init__(self, registry: KafkaTopicRegistry):
        self.registry = registry
        self.lock = threading.Lock()
        self.routes = [
            ("GET", r"/", lambda: {}),
            ("GET", r"/schemas/types", lambda: ["AVRO"]),
            ("GET", r"/schemas/ids/(\d+)", lambda i: {"schema": self._schema(int(i))}),
            ("GET", r"/schemas/ids/(\d+)/schema", lambda i: json.loads(self._schema(int(i)))),
            ("GET", r"/schemas/ids/(\d+)/subjects", lambda i: [s for s, _ in self._holders(int(i))]),
            ("GET", r"/schemas/ids/(\d+)/versions",
             lambda i: [{"subject": s, "version": v} for s, v in self._holders(int(i))]),
            ("GET", r"/subjects", lambda deleted: self.registry.subjects(deleted), "deleted"),
            ("GET", r"/subjects/([^/]+)/versions",
             lambda s, deleted: [n for n, _ in self._versions(s, deleted)], "deleted"),
            ("GET", r"/subjects/([^/]+)/versions/([^/]+)", lambda s, v: self._version(s, v)),
            ("GET", r"/subjects/([^/]+)/versions/([^/]+)/schema",
             lambda s, v: json.loads(self._version(s, v)["schema"])),
            ("POST", r"/subjects/([^/]+)/versions", self._register),
            ("POST", r"/subjects/([^/]+)", self._lookup),
            ("POST", r"/compatibility/subjects/([^/]+)/versions/([^/]+)", self._test_compatibility),
            ("POST", r"/compatibility/subjects/([^/]+)/versions", self._test_compatibility),
            ("GET", r"/config", lambda: {"compatibilityLevel": self.registry.compatibility()}),
            ("PUT", r"/config", lambda body: {"compatibility": self._set_level(body, None)}),
            ("GET", r"/config/([^/]+)", self._subject_level, "defaultToGlobal"),  # a true/false query flag
            ("PUT", r"/config/([^/]+)", lambda s, body: {"compatibility": self._set_level(body, s)}),
            ("DELETE", r"/config/([^/]+)", self._forget_level),
            ("DELETE", r"/subjects/([^/]+)/versions/([^/]+)", self._delete_version, "permanent"),
            ("DELETE", r"/subjects/([^/]+)", lambda s, permanent: self._delete(s, None, permanent), "permanent"),
        ]

    def answer(self, method: str, path: str, body: dict | None, query: str = "") -> tuple[int, object]:
        """(HTTP status, JSON answer) of one request."""
        path = "/" + "/".join(unquote(part) for part in path.strip("/").split("/")) if path.strip("/") else "/"
        try:
            flags = parse_qs(query)
            for verb, pattern, handler, *flag_names in self.routes:
                found = re.fullmatch(pattern, path)
                if verb == method and found:
                    arguments = [*found.groups()] + ([body or {}] if method in ("POST", "PUT") else [])
                    arguments += [flags.get(name, ["false"])[0].lower() == "true" for name in flag_names]
                    with self.lock:
                        return 200, handler(*arguments)
            return 404, {"error_code": 404, "message": f"HTTP 404 Not Found: {method} {path}"}
        except RegistryError as error:
            return error.status, {"error_code": error.code, "message": error.message}
        except RegistryNotFound as error:
            return 404, {"error_code": error.code, "message": str(error)}
        except SkyfilterError as error:
            return 500, {"error_code": 50001, "message": str(error)}

    def _schema(self, schema_id: int) -> str:
        if not self.registry.has_schema(schema_id):
            raise RegistryError(404, 40403, "Schema not found")
        return self.registry.schema(schema_id)

    def _holders(self, schema_id: int) -> list[tuple[str, int]]:
        self._schema(schema_id)
        return self.registry.subjects_of(schema_id)

    def _versions(self, subject: str, deleted: bool = False) -> list[tuple[int, int]]:
        numbered = self.registry.numbered(subject, deleted)
        if not numbered:
            raise _subject_not_found(subject)
        return numbered

    def _version(self, subject: str, version: str) -> dict:
        numbered = self._versions(subject)
        if version in ("latest", "-1"):
            number, schema_id = numbered[-1]
        else:
            found = [pair for pair in numbered if version.isdigit() and pair[0] == int(version)]
            if not found:
                raise RegistryError(404, 40402, f"Version {version} not found.")
            number, schema_id = found[0]
        return {"subject": subject, "version": number, "id": schema_id, "schema": self.registry.schema(schema_id)}

    def _delete_version(self, subject: str, version: str, permanent: bool) -> int:
        if version in ("latest", "-1"):
            version = str(self._versions(subject)[-1][0])
        if not version.isdigit():
            raise RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id.")
        return self._delete(subject, int(version), permanent)[0]

    def _delete(self, subject: str, version: int | None, permanent: bool) -> list[int]:
        return self.registry.delete(subject, version, permanent)

    def _forget_level(self, subject: str) -> dict:
        level = self.registry.own_compatibility(subject)
        if level is None:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        self.registry.forget_compatibility(subject)
        return {"compatibilityLevel": level}

    @staticmethod
    def _offered(body: dict) -> str:
        if body.get("schemaType", "AVRO") != "AVRO":
            raise RegistryError(422, 42201, f"schema type {body['schemaType']} is not supported (AVRO only)")
        if body.get("references"):
            raise RegistryError(422, 42201, "schema references are not supported")
        try:
            text = body["schema"]
            parse_schema(json.loads(text))
        except Exception as exc:  # fastavro raises several kinds for a bad schema
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
        return schema_text(json.loads(text))

    def _register(self, subject: str, body: dict) -> dict:
        text = self._offered(body)
        try:
            return {"id": self.registry.register(subject, text)}
        except IncompatibleSchema as error:
            raise RegistryError(409, 409, str(error)) from None

    def _lookup(self, subject: str, body: dict) -> dict:
        text = self._offered(body)
        wanted = fingerprint(text)
        for number, schema_id in self._versions(subject):
            if fingerprint(self.registry.schema(schema_id)) == wanted:
                return {"subject": subject, "version": number, "id": schema_id,
                        "schema": self.registry.schema(schema_id)}
        raise RegistryError(404, 40403, "Schema not found")

    def _test_compatibility(self, subject: str, *rest) -> dict:
        *version, body = rest
        text = self._offered(body)
        ids = self.registry.versions(subject)
        if version and version[0] not in ("latest", "-1"):
            ids = [self._version(subject, version[0])["id"]]
        level = self.registry.compatibility(subject)
        if version:  # one version given: tested against it alone, whatever the level's transitivity
            level = level.removesuffix("_TRANSITIVE")
            ids = ids[-1:]
        problems = compatibility_problems(level, text, [self.registry.schema(i) for i in ids])
        return {"is_compatible": not problems, **({"messages": problems} if problems else {})}

    def _set_level(self, body: dict, subject: str | None) -> str:
        level = str(body.get("compatibility", "")).upper()
        if level not in LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level '{level}'")
        return self.registry.set_compatibility(level, subject)

    def _subject_level(self, subject: str, default_to_global: bool) -> dict:
        own = self.registry.own_compatibility(subject)
        if own is None and not default_to_global:
            raise RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility "
                                            f"configured")
        return {"compatibilityLevel": own or self.registry.compatibility()}


def _handler(api: RegistryApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            body = None
            if method in ("POST", "PUT"):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    return self._send(422, {"error_code": 422, "message": "Unrecognized JSON in the request"})
            status, answer = api.answer(method, parts.path, body, parts.query)
            self._send(status, answer)

        def _send(self, status: int, answer: object) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_POST(self):  # noqa: N802
            self._serve("POST")

        def do_PUT(self):  # noqa: N802
            self._serve("PUT")

        def do_DELETE(self):  # noqa: N802
            self._serve("DELETE")

        def log_message(self, *args):
            pass

    return Handler


class RegistryServer:
    """The REST server over the embedded registry; ``start()`` serves in a thread, ``serve_forever()`` in this one."""

    def __init__(self, cfg: Config, host: str | None = None, port: int | None = None):
        self.registry = KafkaTopicRegistry(cfg)
        host = host or cfg.schema_registry.serve.host
        port = int(cfg.schema_registry.serve.port if port is None else port)
        try:
            self.server = ThreadingHTTPServer((host, port), _handler(RegistryApi(self.registry)))
        except OSError as exc:
            raise SkyfilterError(f"cannot serve the schema registry on {host}:{port}: {exc.strerror}") from None
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL clients use (``schema_registry.url`` / SchemaRegistryClient's ``url``)."""
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RegistryServer:
        self.thread = threading.Thread(target=self.server.serve_forever, name="skyfilter-registry", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(cfg: Config, host: str | None = None, port: int | None = None) -> None:
    """`skyfilter registry serve`: answer requests until Ctrl-C."""
    server = RegistryServer(cfg, host, port)
    logger.info(f"schema registry serving {server.url} (Confluent REST API) from topic '{server.registry.topic}' at "
                f"{cfg.bootstrap_servers}; Ctrl-C stops it")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    logger.info("schema registry stopped")
