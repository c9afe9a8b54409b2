"""The configuration's sections as typed objects: what each key is, checked when a config is loaded.

Only the kinds live here; every value, defaults included, lives in the YAML files
(the packaged ``local.yaml`` holds every key).  :func:`check_settings` reads a file
or a ``--set`` against these classes, so an unknown or misspelt key, or a value of
the wrong kind, is one error naming the file and the key; :func:`typed` turns a
loaded mapping into the section objects the code reads (``cfg.stream.trigger``).

Null is a value only where a type says ``| None`` (the key's comment in
``local.yaml`` says what null means there).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any

from skyfilter.core.errors import SkyfilterError

Settings = dict[str, Any]  # a mapping handed as it is to a library (librdkafka, Spark's Kafka source)


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str
    mechanism: str
    user: str | None
    credentials_dir: str | None
    ssl_ca_location: str | None
    ssl_truststore: str | None


@dataclass(frozen=True)
class Kafka:
    bootstrap_servers: str
    libs_dir: str
    nodes: int
    base_port: int
    heap: str
    replication_factor: int | str  # a number, or auto
    min_insync_replicas: int | str
    max_message_bytes: int
    start_timeout_s: float
    connect_wait_s: float
    outage_limit_s: float
    security: KafkaSecurity


@dataclass(frozen=True)
class SparkCluster:
    host: str
    master_port: int
    master_webui_port: int
    workers: int
    worker_cores: int
    worker_memory: str
    daemon_memory: str


@dataclass(frozen=True)
class Monitoring:
    port: int | None  # null: no metrics endpoint
    host: str
    lag_interval_s: float
    archive_port: int | None  # the archive process's own endpoint (its archived counts and latency); null: none


@dataclass(frozen=True)
class RegistryServe:
    host: str
    port: int


@dataclass(frozen=True)
class OutputRegistry:
    url: str | None
    basic_auth: str | None


@dataclass(frozen=True)
class SchemaRegistry:
    url: str | None  # null: the embedded registry
    basic_auth: str | None
    topic: str
    compatibility: str
    serve: RegistryServe
    output: OutputRegistry


@dataclass(frozen=True)
class Topics:
    alerts: str
    alerts_partitions: int
    broker_partitions: int
    retention_hours: float
    errors: str


@dataclass(frozen=True)
class Simulation:
    visits: int
    alerts_per_visit: int
    interval_s: float
    stamps: bool
    schema_version: str
    history_length: int


@dataclass(frozen=True)
class Bench:
    schema_version: str


@dataclass(frozen=True)
class Realtime:
    checkpoint_interval: str
    fetch_max_wait_ms: int
    python_filters: bool
    caps: bool
    warm_up_alerts: int
    rehearsal_alerts: int


@dataclass(frozen=True)
class AlertColumns:
    alert_id: str
    time_mjd: str
    visit_id: str
    ra: str
    dec: str


@dataclass(frozen=True)
class NightlyTopics:
    enabled: bool
    retention_hours: float


@dataclass(frozen=True)
class Stream:
    filters_dir: str
    brokers: str
    trigger: str
    starting_offsets: str
    max_offsets_per_trigger: int | None  # null: no bound
    tasks: int | str  # a number, or auto
    source_options: Settings
    realtime: Realtime
    night_offset_hours: float
    alert_columns: AlertColumns
    filter_time_budget_s: float
    hot_reload: bool
    max_alert_bytes: int
    cutout_fields: str | list[str]  # auto, or the field names
    reader_schema: str | int  # family, an .avsc file, or an input registry schema id
    nightly_topics: NightlyTopics


@dataclass(frozen=True)
class Archive:
    trigger: str
    log_trigger: str
    writer: str  # auto | spark | delta-rs (settled per run: RunPlan.archive_writer)
    tasks: int
    max_offsets_per_trigger: int | None
    process: str
    nice: int
    cpu_group: bool
    stop_timeout_s: float
    driver_memory: str | None  # null: spark.driver.memory


@dataclass(frozen=True)
class Maintenance:
    tables: list[str]
    vacuum_retention_hours: float
    keep_nights: int


@dataclass(frozen=True)
class Sections:
    """A whole configuration."""

    state_dir: str
    kafka: Kafka
    spark_cluster: SparkCluster
    monitoring: Monitoring
    schema_registry: SchemaRegistry
    topics: Topics
    producer: Settings
    simulation: Simulation
    bench: Bench
    stream: Stream
    archive: Archive
    maintenance: Maintenance


def check_settings(data: dict, source: str, kind: type = Sections, prefix: str = "") -> None:
    """Raise one clear error, naming ``source`` and the key, for the first key of ``data`` (a whole file or a
    part of one) that ``kind`` does not have, or whose value is not of the kind the key takes."""
    hints = typing.get_type_hints(kind)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise SkyfilterError(f"{source}: unknown config key '{dotted}'{hint}")
        problem = _problem(value, hints[key])
        if problem:
            raise SkyfilterError(f"{source}: config key '{dotted}' {problem}, not {value!r}")
        if isinstance(value, dict) and dataclasses.is_dataclass(_section_of(hints[key])):
            check_settings(value, source, _section_of(hints[key]), f"{dotted}.")


def typed(data: dict, source: str, kind: type = Sections, prefix: str = ""):
    """``data`` (a complete configuration) as section objects, each value of its key's one plain type (a
    ``trigger: 0`` written without quotes is the text "0", a whole number of seconds a float); a key no file
    gives, or a value set by code that is not of its kind, is one error."""
    hints = typing.get_type_hints(kind)
    values = {}
    for key, hint in hints.items():
        if key not in data:
            raise SkyfilterError(f"{source}: missing config key '{prefix}{key}'")
        value = data[key]
        section = _section_of(hint)
        if section is not None and isinstance(value, dict):
            value = typed(value, source, section, f"{prefix}{key}.")
        elif value is not None and not isinstance(value, (dict, list)):
            value = _plain(value, hint, f"{source}: config key '{prefix}{key}'")
        values[key] = value
    return kind(**values)


def _plain(value: Any, hint, where: str) -> Any:
    """``value`` as the one plain type (str, int, float) its key takes; as it is for unions and bool."""
    plain = [choice for choice in _choices(hint) if choice is not type(None)]
    if len(plain) != 1 or plain[0] not in (str, int, float) or isinstance(value, bool):
        return value
    try:
        return plain[0](value)
    except (TypeError, ValueError):
        raise SkyfilterError(f"{where} must be a number, not {value!r}") from None


def _choices(hint) -> tuple:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _section_of(hint) -> type | None:
    return next((choice for choice in _choices(hint) if dataclasses.is_dataclass(choice)), None)


def _problem(value: Any, hint) -> str | None:
    """What is wrong with ``value`` for a key of type ``hint`` (None: nothing)."""
    choices = _choices(hint)
    if value is None:
        return None if type(None) in choices else "cannot be null"
    wants = [_accepts(value, choice) for choice in choices if choice is not type(None)]
    if any(ok for ok, _ in wants):
        return None
    return " or ".join(dict.fromkeys(what for _, what in wants))


def _accepts(value: Any, choice) -> tuple[bool, str]:
    origin = typing.get_origin(choice) or choice
    if choice is bool:
        return isinstance(value, bool), "must be true or false"
    if choice in (int, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok and (choice is float or float(value).is_integer()), "must be a number"
    if origin is list:
        return isinstance(value, list), "must be a list"
    if origin is dict or dataclasses.is_dataclass(choice):
        return isinstance(value, dict), "must be a mapping of settings"
    return not isinstance(value, (dict, list)), "must be a single value"
