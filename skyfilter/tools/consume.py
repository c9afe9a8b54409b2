"""``skyfilter consume TOPIC``: read a broker topic as a community broker would, decoded through the registry.

Like Kafka's console consumer and Fink's ``fink_consumer``: from the committed
position of a consumer group (or ``--from-beginning``), each message decoded
in its topic's layout (:class:`Decoder`: through the output registry for the
Confluent wire format, with the schema in the key for Fink's, or as JSON),
printed as one JSON line or written to a folder as Avro (one container file
per message, with its schema) or JSON files.  Bytes fields (cutouts) print as
their length.
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import fastavro
from confluent_kafka import Consumer, KafkaError, KafkaException

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings
from skyfilter.registry.client import open_registry
from skyfilter.schemas.wire import WireFormatError, unframe


@dataclass
class ConsumeOptions:
    """What ``skyfilter consume`` reads and where it writes."""

    topic: str
    group: str | None = None  # None: a throwaway group, nothing committed
    from_beginning: bool = False
    max_messages: int | None = None
    idle_s: float = 10.0  # stop after this long without a message
    output_dir: Path | None = None
    output_format: str = "json"  # json | avro (files in output_dir)


@dataclass
class ConsumeReport:
    """How a consume went."""

    topic: str
    messages: int = 0
    undecodable: int = 0
    written: int = 0

    def summary(self) -> str:
        line = f"consumed {self.messages} message(s) from '{self.topic}'"
        if self.written:
            line += f", {self.written} file(s) written"
        if self.undecodable:
            line += f", {self.undecodable} not decodable (printed with the reason)"
        return line


class Decoder:
    """Message values to records, whichever layout the topic uses (a broker's ``encoding``).

    * ``confluent``: magic byte and schema id, the writer schema fetched once from the output registry;
    * ``fink``: the Avro schema (JSON) in the key, the Avro body alone in the value;
    * ``json``: one JSON object, no schema.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.registry = open_registry(cfg, output=True)
        self.input_registry = None  # dead letters and resent input carry the input registry's ids
        self.schemas: dict[int, tuple[dict, object]] = {}
        self.key_schemas: dict[bytes, tuple[dict, object] | None] = {}

    def schema(self, schema_id: int) -> tuple[dict, object]:
        """(schema JSON, parsed schema) of an id."""
        if schema_id not in self.schemas:
            try:
                text = self.registry.schema(schema_id)
            except SkyfilterError:
                if self.cfg.get("schema_registry.url", None) == self.cfg.get("schema_registry.output.url", None):
                    raise  # one registry for both
                self.input_registry = self.input_registry or open_registry(self.cfg)
                text = self.input_registry.schema(schema_id)
            definition = json.loads(text)
            self.schemas[schema_id] = definition, fastavro.parse_schema(definition)
        return self.schemas[schema_id]

    def key_schema(self, key: bytes | None) -> tuple[dict, object] | None:
        """(schema JSON, parsed schema) carried in a message key (Fink's layout), or None."""
        if not key or key[:1] != b"{":
            return None
        if key not in self.key_schemas:
            try:
                definition = json.loads(key)
                self.key_schemas[key] = definition, fastavro.parse_schema(definition)
            except (ValueError, fastavro.schema.SchemaParseException, KeyError, TypeError):
                self.key_schemas[key] = None
        return self.key_schemas[key]

    def decode(self, value: bytes, key: bytes | None = None) -> tuple[str, int | None, dict]:
        """(encoding, schema id or None, record) of one message."""
        in_key = self.key_schema(key)
        if in_key is not None:
            return "fink", None, fastavro.schemaless_reader(io.BytesIO(value), in_key[1], None)
        if value and value[:1] == b"{":
            return "json", None, json.loads(value)
        schema_id, body = unframe(value)
        return "confluent", schema_id, fastavro.schemaless_reader(io.BytesIO(body), self.schema(schema_id)[1], None)


def printable(value):
    """A record as JSON can carry it: bytes as their length, NaN as null."""
    if isinstance(value, dict):
        return {k: printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def consume(cfg: Config, options: ConsumeOptions, out=print) -> ConsumeReport:
    """Read, decode and print or write the messages of a topic; returns what was done."""
    decoder = Decoder(cfg)
    report = ConsumeReport(options.topic)
    settings = {"group.id": options.group or f"skyfilter-consume-{uuid.uuid4()}",
                "enable.auto.commit": bool(options.group), "log_level": 0,
                "auto.offset.reset": "earliest" if options.from_beginning else "latest"}
    consumer = Consumer(client_settings(cfg, **settings))
    if options.output_dir:
        options.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        metadata = consumer.list_topics(options.topic, timeout=10)
        info = metadata.topics.get(options.topic)
        if info is None or info.error is not None:
            raise SkyfilterError(f"topic '{options.topic}' does not exist at {cfg.bootstrap_servers}")
        if options.from_beginning and options.group:
            consumer.subscribe([options.topic], on_assign=_rewind)
        else:
            consumer.subscribe([options.topic])
        last = time.monotonic()
        while options.max_messages is None or report.messages < options.max_messages:
            message = consumer.poll(0.5)
            if message is None:
                if time.monotonic() - last > options.idle_s:
                    break
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise SkyfilterError(f"reading '{options.topic}': {message.error().str()}")
            last = time.monotonic()
            report.messages += 1
            _emit(decoder, message, options, report, out)
    except KafkaException as exc:
        raise SkyfilterError(f"cannot read '{options.topic}' at {cfg.bootstrap_servers}: "
                             f"{exc.args[0].str()}") from None
    finally:
        consumer.close()
    return report


def _rewind(consumer: Consumer, partitions) -> None:
    """--from-beginning with a named group: start from the earliest offsets whatever the group committed."""
    for partition in partitions:
        partition.offset = -2  # OFFSET_BEGINNING
    consumer.assign(partitions)


def _emit(decoder: Decoder, message, options: ConsumeOptions, report: ConsumeReport, out) -> None:
    headers = {k: (v.decode(errors="replace") if v is not None else None) for k, v in (message.headers() or [])}
    position = f"{message.topic()}-{message.partition()}-{message.offset()}"
    try:
        encoding, schema_id, record = decoder.decode(message.value(), message.key())
    except Exception as exc:  # noqa: BLE001 - a body that is not what its header says fails in many ways
        report.undecodable += 1
        why = str(exc) if isinstance(exc, (WireFormatError, SkyfilterError)) else \
            f"the body does not decode with its schema ({type(exc).__name__}: {exc})"
        out(json.dumps({"position": position, "error": why, "headers": headers,
                        "value_base64": base64.b64encode(message.value() or b"").decode()}))
        return
    about = {"encoding": encoding, "schema_id": schema_id, "headers": headers, "alert": printable(record)}
    if options.output_dir is None:
        out(json.dumps({"position": position, **about}))
        return
    schema = decoder.schema(schema_id) if encoding == "confluent" else decoder.key_schema(message.key())
    if options.output_format == "avro" and schema is not None:
        with open(options.output_dir / f"{position}.avro", "wb") as handle:
            fastavro.writer(handle, schema[1], [record])
    else:  # JSON, and the messages of a JSON topic whatever the format asked (they have no schema)
        (options.output_dir / f"{position}.json").write_text(json.dumps(about))
    report.written += 1
