"""The delta-rs writers run as the archive's two queries (``archive.writer: delta-rs``).

The stream job starts, polls, stops and drains its queries through a few
members of Spark's ``StreamingQuery``; this thread offers the same ones, so the
job handles the writer as it handles the query it replaces (clean stops
between batches, failures raised with their lane, ``--available-now`` runs that
end at the topic's end).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skyfilter.archive.alerts_writer import MAX_BATCH, AlertsWriter, WriterSettings, app_id
from skyfilter.archive.delta_appends import stored_offsets
from skyfilter.archive.log_writer import LogWriter, logged_offsets
from skyfilter.archive.topic_batches import TopicBatches
from skyfilter.core.alert_columns import AlertColumns
from skyfilter.core.config import Config
from skyfilter.filtering.input_schemas import registered_writers
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.plan.stream_plan import StreamPlan
from skyfilter.plan.triggers import AVAILABLE_NOW, seconds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchiveTarget:
    """What the writers need of a stream when there is no :class:`StreamPlan` (an archive process without Spark):
    the same names a plan has."""

    topic: str
    name: str
    tables: dict[str, Path]
    delivery_log_topic: str
    night_offset_hours: float
    max_alert_bytes: int | None
    columns: AlertColumns


Target = StreamPlan | ArchiveTarget


class WriterQuery:
    """A writer (:class:`AlertsWriter`, :class:`LogWriter`) on a thread of its own, answering as a streaming query."""

    def __init__(self, make_writer: Callable[[], TopicBatches], name: str, available_now: bool = False,
                 lane: str = "archive"):
        self.id = uuid.uuid5(uuid.NAMESPACE_URL, f"skyfilter:{name}:{lane}:delta-rs")
        self.name = name
        self.available_now = available_now
        self.make_writer = make_writer
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.writer: TopicBatches | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"{lane}-writer-{name}")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.writer = self.make_writer()
            self.writer.resume()
            self.writer.run(lambda: not self.stopping.is_set(), self.available_now)
        except BaseException as exc:  # noqa: BLE001 - handed to the job, which names the lane and the cause
            self.error = exc
        finally:
            if self.writer is not None:
                self.writer.close()

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return self.thread.is_alive()

    @property
    def status(self) -> dict:
        """Whether a batch is being written (the job stops between batches)."""
        writing = self.writer is not None and self.writer.writing
        return {"isDataAvailable": writing, "isTriggerActive": writing}

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802 - StreamingQuery's name
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def exception(self) -> BaseException | None:
        return self.error

    def stop(self) -> None:
        """Stop after the batch under way is committed."""
        self.stopping.set()
        self.thread.join()


def start_writer(cfg: Config, plan: Target, trigger: str, monitor: StreamMonitor | None = None,
                 on_batch: Callable[[str], None] | None = None) -> WriterQuery:
    """The alerts writer of a stream, started as the archive's alerts query with this trigger (``availableNow``:
    until the topic's end as it is now), reporting to ``monitor`` if one is given and each batch's line to
    ``on_batch``."""
    available_now = trigger == AVAILABLE_NOW
    settings = WriterSettings(
        topic=plan.topic, name=plan.name, tables=plan.tables, delivery_log_topic=plan.delivery_log_topic,
        trigger_s=1.0 if available_now else seconds(trigger),
        max_alerts=min(int(cfg.archive.max_offsets_per_trigger or MAX_BATCH), MAX_BATCH),
        night_offset_hours=plan.night_offset_hours,
        max_alert_bytes=plan.max_alert_bytes, starting_offsets=str(cfg.stream.starting_offsets))
    return WriterQuery(lambda: AlertsWriter(cfg, settings, plan.columns,
                                            lambda: registered_writers(cfg, plan.topic), monitor, on_batch),
                       plan.name, available_now)


def start_log_writer(cfg: Config, plan: Target, trigger: str, monitor: StreamMonitor | None = None,
                     on_batch: Callable[[str], None] | None = None) -> WriterQuery:
    """The delivery-log writer of a stream, started as the archive's log query with this trigger."""
    available_now = trigger == AVAILABLE_NOW
    return WriterQuery(lambda: LogWriter(cfg, plan.name, plan.delivery_log_topic, plan.tables,
                                         1.0 if available_now else seconds(trigger),
                                         int(cfg.archive.max_offsets_per_trigger or MAX_BATCH), monitor,
                                         on_batch),
                       plan.name, available_now, "archive-log")


def logged_log_offsets(plan: Target) -> Callable[[list[int]], dict[int, int]]:
    """The next offset of each delivery-log partition every log table has committed (the log query's lag is
    measured against them)."""
    return lambda partitions: logged_offsets(plan.tables, plan.name, plan.delivery_log_topic, partitions)


def archived_offsets(plan: Target) -> Callable[[list[int]], dict[int, int]]:
    """The next offset of each input partition the writer has committed (the archive lane's lag is measured
    against them: it keeps no checkpoint)."""
    return lambda partitions: stored_offsets(plan.tables["alerts"], app_id(plan.name), plan.topic, partitions,
                                             scan=False)
