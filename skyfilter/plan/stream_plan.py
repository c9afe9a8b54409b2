"""Everything the stream job settles before it starts: schema, filters, brokers, topics, tables.

Kept apart from the batch code so that a later reload (new filters, new
brokers) can build a fresh plan and swap it in between two batches.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from skyfilter.core.alert_columns import AlertColumns, detect
from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterProblem, FilterSpec
from skyfilter.filtering.decode import decode, reserved_columns
from skyfilter.filtering.filter_eval import validate_filters
from skyfilter.filtering.input_schemas import InputSchemas, load_input_schemas
from skyfilter.kafka.topics import ensure_topics
from skyfilter.plan.outgoing import Encoding
from skyfilter.plan.outputs import prepare_outputs
from skyfilter.plan.stream_files import StreamFiles
from skyfilter.plan.tables import table_paths
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import cutout_fields, filled_record, schema_text, schemaless_body, without_fields
from skyfilter.schemas.wire import frame
from skyfilter.watch.columns import (
    Watch,
    broker_matches,
    broker_uses,
    known_in,
    load_watch,
    references,
    subscription_filters,
    template_columns,
    used_by,
)

logger = logging.getLogger(__name__)

KAFKA_SOURCE_SCHEMA = T.StructType([
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
    T.StructField("timestampType", T.IntegerType()),
])

PROBE_ALERTS = 200  # enough to generate and load a query's code (compiling it by the JIT takes thousands)


def probe_batch(spark, plan: StreamPlan, alerts: int = PROBE_ALERTS) -> DataFrame:
    """Input rows shaped like the Kafka source's, to run a lane's query once before alerts come.

    One empty row (the path of a message that cannot be decoded) and ``alerts`` alerts with
    every field filled in, spread over the topic's writer schemas, so that the code the first
    visit needs is generated, loaded and compiled by the JVM beforehand.
    """
    rows = [(None, None, plan.topic, 0, -1, None, 0)]
    values = probe_values(plan)
    now = datetime.now(UTC)
    rows += [(None, values[i % len(values)], plan.topic, 0, -2 - i, now, 0) for i in range(alerts if values else 0)]
    return spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)


def probe_values(plan: StreamPlan) -> list[bytes]:
    """One probe message per writer schema of the topic (every field filled in), so that every writer's decoding
    gets compiled."""
    values = []
    for schema_id, text in plan.inputs.readable.items():
        writer = json.loads(text)
        values.append(frame(schema_id, schemaless_body(writer, filled_record(writer))))
    return values


@dataclass(frozen=True)
class StreamPlan:
    """The settled inputs of one run of the stream job.

    A plan is a value that never changes: hot reload, quarantine and new input
    schema versions build a new one (``dataclasses.replace``) and swap it into
    the job's :class:`PlanCell`.  It holds the settings its queries are built
    from, not the config: what a cache keys on is :attr:`value_key`.
    """

    name: str
    topic: str
    schema_id: int
    schema: dict
    columns: AlertColumns
    filters: list[FilterSpec]
    brokers: list[BrokerSpec]  # each frozen; enabled_filters says which of its filters run
    encodings: dict[str, Encoding]
    cutouts: list[str]
    inputs: InputSchemas  # every writer schema of the topic, read as one reader schema
    tables: dict[str, Path]
    checkpoint: Path  # one checkpoint folder per lane inside (see lane_checkpoint)
    night_offset_hours: float
    files: StreamFiles  # what the filter and broker files said, read once (and again at each reload)
    problems: list[FilterProblem | str] = field(default_factory=list)
    max_alert_bytes: int | None = None
    filter_time_budget_s: float = 30.0  # stream.filter_time_budget_s: a Python filter's time per batch
    watch: Watch = field(default_factory=Watch)  # the watchlists and watchmaps filters may name, versions read now

    @cached_property
    def value_key(self) -> tuple:
        """Everything the plan's queries are built from, as one hashable value: equal keys, same queries
        (the problems it reports and the files it was read from are left out)."""
        return frozen_value({f.name: getattr(self, f.name) for f in fields(self)
                             if f.name not in ("problems", "files")})

    @property
    def deadletter_topic(self) -> str:
        """Where undecodable input messages go, bytes unchanged, with the reason in a header."""
        return f"{self.topic}.deadletter"

    @property
    def delivery_log_topic(self) -> str:
        """The delivery lane's log of what it sent (matches and per-batch summaries), read by the archive lane."""
        return delivery_log_topic(self.topic, self.name)

    def output_topics(self, brokers: list[BrokerSpec]) -> list[str]:
        """The topics a delivery lane serving ``brokers`` writes to: theirs, the dead letters, the delivery log."""
        return [b.topic for b in brokers] + [self.deadletter_topic, self.delivery_log_topic]

    @property
    def schema_json(self) -> str:
        """The reader schema of the topic when the stream started."""
        return schema_text(self.schema)

    @property
    def reader_json(self) -> str:
        """The schema filters see: the topic's reader schema without its cutout fields."""
        return reader_schema_json(self.inputs.reader, self.cutouts)

    def lane_checkpoint(self, lane: str) -> Path:
        """The checkpoint of one lane of this stream (``delivery``, ``realtime`` or ``archive``)."""
        return self.checkpoint / lane

    def decode(self, raw: DataFrame) -> DataFrame:
        """Kafka rows of this topic, decoded without the cutouts, as filters see them (``filtering/decode.py``)."""
        return decode(raw, self.inputs, self.columns, self.night_offset_hours, self.max_alert_bytes,
                      self.reader_json)


def frozen_value(value: object) -> object:
    """``value`` as nested tuples that compare and hash by content (dataclasses by type and fields, mappings by
    sorted items, paths as text)."""
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(frozen_value(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, dict):
        return tuple(sorted((str(k), frozen_value(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = tuple(frozen_value(v) for v in value)
        return tuple(sorted(items, key=repr)) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, Path):
        return str(value)
    return value


class PlanCell:
    """The stream's current plan, shared by its lanes, reloader and quarantine.

    A change builds a new plan from the current one and swaps it in
    (:meth:`update`, one change at a time); each lane takes the current plan at
    the start of a batch, so a batch runs with one plan from start to end.
    """

    def __init__(self, plan: StreamPlan):
        self._plan = plan
        self._lock = threading.Lock()

    @property
    def current(self) -> StreamPlan:
        """The plan in force now."""
        return self._plan

    def update(self, change: Callable[[StreamPlan], StreamPlan | None]) -> StreamPlan:
        """Swap in ``change(current)`` (nothing when it returns None); returns the plan in force after."""
        with self._lock:
            new = change(self._plan)
            if new is not None:
                self._plan = new
            return self._plan


def delivery_log_topic(topic: str, name: str) -> str:
    """The delivery log topic of stream ``name`` reading ``topic`` (under the topic's own prefix)."""
    return f"{topic}.delivery-log" + ("" if name == topic else f".{name}")


def reader_schema_json(definition: dict, cutouts: list[str]) -> str:
    """A reader schema for ``definition`` without its cutout fields (same record name, as resolution needs)."""
    return schema_text(without_fields(definition, cutouts, suffix=None))


def wait_for_schema(cfg: Config, topic: str, wait_s: float) -> tuple[int, str] | None:
    """The (id, schema) registered for a topic, waiting up to ``wait_s`` seconds for a producer."""
    registry = open_registry(cfg)
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        found = registry.latest(subject_for(topic))
        if found or time.monotonic() >= deadline:
            return found
        if not announced:
            logger.info(f"waiting for a producer to register the schema of topic '{topic}'...")
            announced = True
        time.sleep(2.0)


def resolve_filters(template: DataFrame, files: StreamFiles, previous: dict[str, FilterSpec] | None = None
                    ) -> tuple[list[FilterSpec], list[BrokerSpec], list[FilterProblem | str]]:
    """Check the filters the files hold against a frame's columns; attach each broker's working filters.

    Returns the filters to evaluate (those some broker uses), the brokers, and
    one line per problem.  ``previous`` (a running stream's filters) keeps the
    last good version of a filter whose file is now broken (unless it names a
    list or map that is gone).  A broker's ``watchlists:``/``watchmaps:``
    subscriptions are filters of their own (``watchlist:<name>``).
    """
    filters_dir, brokers_file = files.filters_dir, files.brokers_file
    specs, load_problems, brokers = list(files.filters), list(files.problems), list(files.brokers)
    specs += subscription_filters(brokers, brokers_file)
    wanted = {name for broker in brokers for name in broker.filters}
    valid, check_problems = validate_filters(template, specs)
    problems: list[FilterProblem | str] = [*load_problems, *check_problems]
    known_watch = known_in(template)
    for problem in problems:
        name = problem.path.stem
        if previous and name in previous and all(s.name != name for s in valid) \
                and references(previous[name]) <= known_watch:
            valid.append(previous[name])
    enabled = [s for s in valid if s.name in wanted]
    enabled_names = {s.name for s in enabled}
    known = {s.name for s in specs} | {p.path.stem for p in load_problems}
    brokers = [with_enabled(broker, enabled, [f for f in broker.filters if f in enabled_names])
               for broker in brokers]
    for broker in brokers:
        for missing in (f for f in broker.filters if f not in known):
            problems.append(f"{brokers_file}:{broker.line}: broker '{broker.name}' names filter '{missing}', "
                            f"which is not in {filters_dir}")
        if not broker.enabled_filters:
            problems.append(f"{brokers_file}:{broker.line}: broker '{broker.name}' has no working filter; "
                            f"it receives nothing until one is fixed")
    return enabled, brokers, problems


def with_enabled(broker: BrokerSpec, filters: list[FilterSpec], names: list[str]) -> BrokerSpec:
    """``broker`` running its filters ``names`` (of the stream's ``filters``), with the matches among the lists
    and maps those use."""
    uses = broker_uses(names, filters)
    return replace(broker, enabled_filters=tuple(names), watch_matches=broker_matches(uses) if uses else "")


def configured_cutouts(cfg: Config, definition: dict) -> list[str]:
    """The cutout fields of a schema: from ``stream.cutout_fields``, or detected."""
    cutouts = cfg.stream.cutout_fields
    return cutout_fields(definition) if cutouts in (None, "auto") else list(cutouts)


def template_frame(spark: SparkSession, cfg: Config, schemas: InputSchemas, watch: Watch | None = None
                   ) -> tuple[DataFrame, AlertColumns]:
    """An empty frame with exactly the columns filters see for these schemas (what the delivery lane decodes),
    and the columns of every list and map in ``watch``."""
    definition = schemas.reader
    clash = sorted(set(reserved_columns()) & {f["name"] for f in definition["fields"]})
    if clash:
        raise SkyfilterError(f"schema '{definition.get('name')}' has field(s) {', '.join(clash)}, "
                             f"names the stream reserves for its own columns")
    columns = detect(definition, cfg)
    offset = cfg.stream.night_offset_hours
    reader = reader_schema_json(definition, configured_cutouts(cfg, definition))
    decoded = decode(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), schemas, columns, offset, reader_json=reader)
    return decoded.withColumns(template_columns(watch or Watch())), columns


def build_plan(spark: SparkSession, cfg: Config, topic: str, name: str, files: StreamFiles,
               schema: tuple[int, str]) -> StreamPlan:
    """Validate the filters and brokers of ``files`` against the topic's schemas (``schema``: one registered,
    what the stream waited for); create output topics.  The reader is the one ``stream.reader_schema``'s policy
    chooses."""
    inputs = load_input_schemas(cfg, topic)
    schema_id = inputs.reader_id if inputs.reader_id is not None else 0
    definition = inputs.reader
    watch = load_watch(cfg)
    template, columns = template_frame(spark, cfg, inputs, watch)
    offset = cfg.stream.night_offset_hours
    enabled, brokers, problems = resolve_filters(template, files)
    if used_by(enabled) and (columns.ra is None or columns.dec is None):
        raise SkyfilterError(f"filters name watchlists or watchmaps, but schema '{definition.get('name')}' has no "
                             f"known position: set stream.alert_columns.ra and stream.alert_columns.dec")
    cutouts = configured_cutouts(cfg, inputs.reader)
    encodings = prepare_outputs(cfg, template, inputs, cutouts, brokers, enabled)
    ensure_topics(cfg, {f"{topic}.deadletter": cfg.topics.broker_partitions,
                        delivery_log_topic(topic, name): cfg.topics.broker_partitions})
    return StreamPlan(
        name=name, topic=topic, schema_id=schema_id, schema=definition,
        columns=columns, filters=enabled, brokers=brokers, encodings=encodings, cutouts=cutouts, inputs=inputs,
        tables=table_paths(cfg, name), checkpoint=cfg.checkpoint_dir / name, night_offset_hours=offset,
        problems=problems, files=files, max_alert_bytes=cfg.stream.max_alert_bytes,
        filter_time_budget_s=cfg.stream.filter_time_budget_s, watch=watch)
