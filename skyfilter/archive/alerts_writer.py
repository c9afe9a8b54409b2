"""The archive's alerts query without Spark: the input topic to ``alerts`` and ``rejects`` by delta-rs.

What the Spark alerts query does per batch (``skyfilter/archive/alerts_lane.py``),
at a fraction of its CPU and with no JVM: a confluent-kafka consumer reads the
input topic, each message's index columns are decoded from its leading fields
(``skyfilter/archive/index_fields.py``), and each batch is one Delta commit that
carries the next offset of every partition it covers
(``skyfilter/archive/delta_appends.py``): a restart resumes from the table
itself, so every alert is archived once.  Rejects are appended first, with
their own offsets, so a batch retried after a crash skips those already kept.

Each batch sends the same ``batch`` record to the delivery log as the Spark
lane (the ``metrics`` table's archive rows) and prints the same
``archive batch N: ...`` line, which the stream job relays and counts.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from skyfilter.archive.delta_appends import (
    ALERTS_SCHEMA,
    REJECTS_SCHEMA,
    SCHEMAS_SCHEMA,
    append_once,
    append_rows,
    read_column,
    stored_offsets,
)
from skyfilter.archive.index_fields import IndexFields
from skyfilter.archive.layout import STATS_COLUMNS
from skyfilter.archive.topic_batches import TopicBatches, next_offsets
from skyfilter.core.alert_columns import AlertColumns
from skyfilter.core.config import Config
from skyfilter.core.lane_names import LaneName
from skyfilter.kafka.clients import client_settings
from skyfilter.lanes.monitoring import StreamMonitor

logger = logging.getLogger(__name__)

LANE = LaneName.ARCHIVE
MAX_BATCH = 1_000  # messages per commit at most (about 130 MB of Rubin alerts): a batch is held in Python twice,
                   # and 1,000 cost 25% less CPU per alert than 3,000 (fewer fresh pages to fault in)


@dataclass(frozen=True)
class WriterSettings:
    """What the writer needs of a stream, settled by the job that starts it."""

    topic: str
    name: str
    tables: dict[str, Path]
    delivery_log_topic: str
    trigger_s: float  # a batch is at most this long a window of arrivals
    max_alerts: int   # and at most this many messages
    night_offset_hours: float
    max_alert_bytes: int | None
    starting_offsets: str  # "earliest", "latest" or a Spark offsets JSON of the input topic


class AlertsWriter(TopicBatches):
    """Reads the input topic and appends every message once to ``alerts`` (or ``rejects``)."""

    def __init__(self, cfg: Config, settings: WriterSettings, columns: AlertColumns,
                 registered: Callable[[], dict[int, str]], monitor: StreamMonitor | None = None,
                 on_batch: Callable[[str], None] | None = None):
        from confluent_kafka import Producer

        super().__init__(cfg, settings.topic, f"skyfilter-{settings.name}-archive", settings.trigger_s,
                         settings.max_alerts, monitor, on_batch)
        self.settings = settings
        self.app_id = app_id(settings.name)
        self.index = IndexFields(columns, settings.night_offset_hours, settings.max_alert_bytes)
        self.registered = registered  # the writer schemas registered for the topic, id -> text (asked again for
        self.recorded = set(read_column(settings.tables["schemas"], "schema_id"))  # an id not seen before)
        self._look_up(None)
        self.summaries = Producer(client_settings(cfg, acks="all", log_level=0, **{"enable.idempotence": True}))
        self.run_id = str(uuid.uuid4())

    def _look_up(self, messages: list | None) -> None:
        """Read the registry again when messages carry writer ids not known yet (and at the start)."""
        if messages is not None:
            ids = {int.from_bytes(m.value()[1:5], "big") for m in messages if m.value() and len(m.value()) >= 5}
            if ids <= self.index.known:
                return
        for schema_id, text in self.registered().items():
            if schema_id not in self.index.known:
                self.add_writer(schema_id, text)

    def add_writer(self, schema_id: int, text: str) -> None:
        """Archive messages of this writer schema, and keep the schema in ``schemas`` (once per id)."""
        try:
            self.index.add_writer(schema_id, text)
        except ValueError as exc:
            self.index.reject_writer(schema_id, f"schema id {schema_id}: {exc}")
        if schema_id not in self.recorded:
            append_rows(self.settings.tables["schemas"],
                        pa.Table.from_pylist([{"schema_id": schema_id, "schema_json": text}], schema=SCHEMAS_SCHEMA))
            self.recorded.add(schema_id)

    def stored(self, partitions: list[int]) -> dict[int, int]:
        return stored_offsets(self.settings.tables["alerts"], self.app_id, self.topic, partitions)

    def first_offset(self, partition: int) -> int:
        """The stream's start: ``earliest``, ``latest`` or the partition's offset in a Spark offsets JSON."""
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

        start = self.settings.starting_offsets
        named = json.loads(start).get(self.topic, {}) if start.startswith("{") else {}
        return int(named.get(str(partition), OFFSET_END if start == "latest" else OFFSET_BEGINNING))

    def write_batch(self, messages: list) -> None:
        started = time.time()
        self._look_up(messages)
        rows = [{"kafka_topic": m.topic(), "kafka_partition": m.partition(), "kafka_offset": m.offset(),
                 "kafka_timestamp": m.timestamp()[1] * 1000, "kafka_key": m.key(), "kafka_value": m.value()}
                for m in messages]
        batch = self.index.split(rows)
        offsets = next_offsets(messages)
        tables = self.settings.tables
        if batch.rejected:
            kept = stored_offsets(tables["rejects"], self.app_id, self.topic, sorted(offsets))
            fresh = [r for r in batch.rejected if r["kafka_offset"] >= kept.get(r["kafka_partition"], -1)]
            if fresh:
                append_once(tables["rejects"], _table(fresh, REJECTS_SCHEMA, batch_id=self.batches),
                            self.app_id, offsets)
        version = append_once(tables["alerts"], _table(batch.accepted, ALERTS_SCHEMA), self.app_id, offsets,
                              ["night"], {"delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS)})
        finished = time.time()
        summary = self._summarize(version, started, finished, rows, batch)
        if self.monitor is not None:
            stats = {"input_alerts": len(rows), "archived": len(batch.accepted), "rejected": len(batch.rejected)}
            figures = self.monitor.batch_figures(str(LANE), version, started, finished, len(rows), [])
            self.monitor.observe_archive(version, stats, figures, started, finished,
                                         [summary[f"latency_p{q}_ms"] for q in (50, 95, 99)],
                                         summary["latency_max_ms"])
        self.batch_done(f"archive batch {version}: {len(batch.accepted)} alerts archived, {len(batch.rejected)} "
                        f"rejected, done in {finished - started:.2f} s")

    def _summarize(self, version: int, started: float, finished: float, rows: list[dict], batch) -> dict:
        """The batch's ``batch`` record in the delivery log: latency from input append time to archived."""
        appended = sorted(r["kafka_timestamp"] / 1000.0 for r in batch.accepted)

        def quantile(q: float) -> float | None:
            return None if not appended else finished * 1000 - appended[min(len(appended) - 1,
                                                                           int(q * len(appended)))]
        summary = {"kind": "batch", "stream": self.settings.name, "lane": str(LANE), "query_id": self.app_id,
                   "run_id": self.run_id, "batch_id": version, "trigger": f"{self.settings.trigger_s:g}s",
                   "started_at_ms": started * 1000, "delivered_at_ms": None, "finished_at_ms": finished * 1000,
                   "input_alerts": len(rows), "rejected": len(batch.rejected), "archived": len(batch.accepted),
                   "matches": None, "matches_by_broker": {}, "matches_by_filter": {}, "filter_errors": {},
                   "latency_p50_ms": quantile(0.5), "latency_p95_ms": quantile(0.05),
                   "latency_p99_ms": quantile(0.01), "latency_max_ms": quantile(0.0),
                   "input_rows_per_second": None, "processed_rows_per_second":
                       len(rows) / max(finished - started, 1e-3),
                   "kafka_lag": {}, "quarantined_filters": [], "broker_visits": []}
        self.summaries.produce(self.settings.delivery_log_topic, key=f"{LANE}:{version}".encode(),
                               value=json.dumps(summary).encode())
        self.summaries.poll(0)
        return summary

    def close(self) -> None:
        """Let go of Kafka (the offsets live in the table: nothing to commit)."""
        self.summaries.flush(10)
        super().close()


def _table(rows: list[dict], schema: pa.Schema, **constant) -> pa.Table:
    """Rows as a table of ``schema`` (Kafka timestamps in microseconds), built column by column."""
    return pa.Table.from_pydict({name: [constant[name]] * len(rows) if name in constant else
                                 [row.get(name) for row in rows] for name in schema.names}, schema=schema)


def app_id(name: str) -> str:
    """The app transaction prefix a stream's writer commits its offsets under."""
    return f"skyfilter:{name}:{LANE}"
