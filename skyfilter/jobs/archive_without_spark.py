"""The archive lane without Spark: ``filter_stream.py --lane archive`` with ``archive.writer: delta-rs``.

With the delta-rs writers the archive needs no JVM: the alerts writer and the
delivery-log writer are two threads of one Python process.  A stream job's
archive process is such a job, so the archive's start costs delivery no second
JVM start-up on shared cores, and its batches no Spark planning.  It says what
the Spark archive job says (its ``running:`` line, its batch lines, its
errors), stops as it does (SIGTERM: the batch under way commits, then it
archives what the topic and the log hold, and exits 0) and resumes, after any
ending, from the offsets its tables hold.
"""

from __future__ import annotations

import json
import logging
import signal
import time

from skyfilter.archive.writer_query import (
    ArchiveTarget,
    WriterQuery,
    archived_offsets,
    logged_log_offsets,
    start_log_writer,
    start_writer,
)
from skyfilter.core.alert_columns import detect
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LaneName
from skyfilter.jobs.stop_signals import StopSignals
from skyfilter.kafka.topics import ensure_topics
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.totals import StreamTotals
from skyfilter.local.status import write_starting
from skyfilter.plan.stream_plan import delivery_log_topic
from skyfilter.plan.tables import raw_layout, table_paths
from skyfilter.plan.triggers import AVAILABLE_NOW

logger = logging.getLogger(__name__)

POLL_S = 0.5


def target(cfg: Config, topic: str, name: str, schema_text: str) -> ArchiveTarget:
    """The stream's archive: its tables, its delivery log and the index columns of its input schema."""
    return ArchiveTarget(topic=topic, name=name, tables=table_paths(cfg, name),
                         delivery_log_topic=delivery_log_topic(topic, name),
                         night_offset_hours=cfg.stream.night_offset_hours, max_alert_bytes=cfg.stream.max_alert_bytes,
                         columns=detect(json.loads(schema_text), cfg))


def check_layout(archive: ArchiveTarget) -> None:
    """Refuse an ``alerts`` table that is not of the raw layout: the delta-rs writer only appends that one."""
    path = archive.tables["alerts"]
    if raw_layout(path) is False:
        raise SkyfilterError(f"{path} is not of the raw layout (the message and its index columns), which "
                             f"archive.writer delta-rs does not write: use archive.writer spark, or another --name")


class ArchiveWithoutSpark:
    """The two writers of a stream's archive, started, watched, stopped and drained."""

    def __init__(self, cfg: Config, archive: ArchiveTarget, trigger: str, log_trigger: str):
        self.cfg, self.archive = cfg, archive
        self.totals = StreamTotals()
        self.triggers = {LaneName.ARCHIVE: trigger, LaneName.ARCHIVE_LOG: log_trigger}
        self.queries: dict[str, WriterQuery] = {}
        self.monitor: StreamMonitor | None = None

    def serve_metrics(self) -> StreamMonitor:
        """Serve the archive's own metrics at ``monitoring.port`` (a stream job's archive process gets
        ``monitoring.archive_port``): archived counts, batch times, lag against what the tables hold."""
        self.monitor = StreamMonitor(self.cfg, self.archive.name, self.archive.topic)
        checkpoint = self.cfg.checkpoint_dir / self.archive.name
        self.monitor.add_lane(LaneName.ARCHIVE, checkpoint / LaneName.ARCHIVE, self.triggers[LaneName.ARCHIVE],
                              committed=archived_offsets(self.archive))
        self.monitor.add_lane(LaneName.ARCHIVE_LOG, checkpoint / LaneName.ARCHIVE_LOG,
                              self.triggers[LaneName.ARCHIVE_LOG], self.archive.delivery_log_topic,
                              logged_log_offsets(self.archive))
        return self.monitor

    def start(self, lane: str, trigger: str) -> WriterQuery:
        """Start one writer (``availableNow``: until its topic's end as it is now)."""
        start = start_writer if lane == LaneName.ARCHIVE else start_log_writer
        self.queries[lane] = start(self.cfg, self.archive, trigger, self.monitor, self.totals.count_line)
        return self.queries[lane]

    def run(self, signals: StopSignals) -> bool:
        """Run both writers until a stop signal (True) or until one of them fails (its error raised)."""
        for lane, trigger in self.triggers.items():
            self.start(lane, trigger)
        while signals.received is None:
            time.sleep(POLL_S)
            if self.monitor is not None:
                self.monitor.tick({lane: query.isActive for lane, query in self.queries.items()})
            for lane, query in self.queries.items():
                if not query.isActive:
                    raise self.failure(lane, query)
        return True

    def stop(self) -> None:
        """Stop both writers after their batches under way commit."""
        for query in self.queries.values():
            query.stop()

    def drain(self) -> None:
        """Archive what the topic and the delivery log hold now: the alerts first (their figures go to the log)."""
        for lane in (LaneName.ARCHIVE, LaneName.ARCHIVE_LOG):
            query = self.start(lane, AVAILABLE_NOW)
            query.awaitTermination()
            if query.exception() is not None:
                raise self.failure(lane, query)

    def failure(self, lane: str, query: WriterQuery) -> SkyfilterError:
        return SkyfilterError(f"stream '{self.archive.name}': the {lane} lane failed: "
                              f"{query.exception() or 'its writer stopped'}")


def write_running(cfg: Config, name: str, job: ArchiveWithoutSpark) -> None:
    """The archive-only status file of a running job (``skyfilter status`` shows its lanes beside delivery's)."""
    write_starting(cfg, name, job.archive.topic, "running", archive_only=True, master="none (delta-rs, no JVM)",
                   lanes={lane: {"trigger": trigger} for lane, trigger in job.triggers.items()})


def run(cfg: Config, name: str, schema_text: str, available_now: bool) -> StreamTotals:
    """Run the archive of a stream without Spark until told to stop (or, with ``available_now``, caught up)."""
    archive = target(cfg, cfg.topics.alerts, name, schema_text)
    check_layout(archive)
    ensure_topics(cfg, {archive.delivery_log_topic: cfg.topics.broker_partitions})
    job = ArchiveWithoutSpark(cfg, archive, cfg.archive.trigger, cfg.archive.log_trigger)
    if available_now:
        logger.info(f"stream '{name}' running: archive (availableNow, delta-rs, no JVM)")
        job.drain()
        return job.totals
    signals = StopSignals()
    signals.catch()
    monitor = job.serve_metrics()
    try:
        write_running(cfg, name, job)
        if monitor.url:
            logger.info(f"metrics at {monitor.url}")
        logger.info(f"stream '{name}' running: archive (trigger {cfg.archive.trigger}, log {cfg.archive.log_trigger}, "
                    f"delta-rs, no JVM)")
        job.run(signals)
        logger.info(f"stopping on signal {signal.Signals(signals.received).name}: the archive catches up with what "
                    f"was delivered")
        signals.second_stops_at_once(archive_only=True)
        job.stop()
        job.drain()
    finally:
        job.stop()
        monitor.close()
        signals.restore()
    return job.totals
