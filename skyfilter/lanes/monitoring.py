"""What a running stream tells its operators: Prometheus metrics per lane, and the same figures for Delta.

:class:`StreamMonitor` serves one registry per stream at
``http://<monitoring.host>:<monitoring.port>/metrics`` (a ``lane`` label on
per-lane series).  What must move within seconds in every mode comes as it
happens: delivery latency per broker (a histogram, from each alert's input
append time to its delivery), matches per filter and broker, and dead letters
are heard from the delivery log (``skyfilter/lanes/log_follower.py``); a
Real-time query's alerts read and its lag come from where its tasks have read
to (``skyfilter/lanes/read_positions.py``).  Each batch's figures (micro-batch,
or a Real-time checkpoint) also go to the stream's ``metrics`` table, so a
dashboard and a query over the archive read the same numbers.  A heartbeat
moves every second the job lives, so a quiet night is told from a dead job.  A
taken port or an unreachable Kafka costs the metrics, never the stream: one
line is logged.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from skyfilter.core.config import Config
from skyfilter.core.figures import DeliveryFigures
from skyfilter.kafka.lag import LatestOffsets, committed_offsets, lag_per_partition
from skyfilter.lanes.log_follower import DeliveryLogFollower
from skyfilter.lanes.read_positions import OldestUnread, Positions, consumer_group
from skyfilter.lanes.recent_latency import LATENCY_BUCKETS, RecentLatency

logger = logging.getLogger(__name__)

FILTER_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)  # seconds per batch
STATISTICS = ("p50", "p95", "p99")  # a batch's latency figures, in the order of its quantiles


@dataclass
class LaneState:
    """What the monitor knows of one lane: where its checkpoint is, its last batch, its lag."""

    checkpoint: Path
    trigger: str
    topic: str                    # what the lane's query reads (its lag is measured on it)
    previous_start: float | None = None
    last_batch: dict = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    lag_seconds: dict[int, float] = field(default_factory=dict)
    lag_at: float = 0.0
    committed: Positions | None = None  # the lane's read positions, when better known than from its checkpoint
    rows_read: Callable[[], int] | None = None  # alerts the lane's tasks have read so far (read marks)
    rows_counted: int = 0


class StreamMonitor:
    """The metrics of one stream's lanes: updated per batch, served over HTTP when ``monitoring.port`` is set."""

    def __init__(self, cfg: Config, stream: str, topic: str):
        self.cfg = cfg
        self.stream = stream
        self.topic = topic
        self.run_id = uuid.uuid4().hex[:12]
        self.lanes: dict[str, LaneState] = {}
        self.lag_interval_s = cfg.monitoring.lag_interval_s
        self.latest: LatestOffsets | None = None
        self.server = None
        self.url: str | None = None
        self.lock = threading.Lock()  # batch threads, the listener and the job's main loop all refresh the lag
        self.quarantined: list[str] = []
        self.stopping = threading.Event()
        self.commit_failed: set[str] = set()  # consumer groups whose commit failed once (said once)
        self.measuring = threading.Thread(target=self._measure_between_batches, daemon=True, name="lag-measure")
        self.follower: DeliveryLogFollower | None = None
        self.recent = RecentLatency()
        self.outage_noted_at: float | None = None
        self.registry = CollectorRegistry()
        self._define()
        self._serve(cfg.monitoring.port, cfg.monitoring.host)

    def _define(self) -> None:
        r, s, lane = self.registry, ["stream"], ["stream", "lane"]
        self.info = Info("skyfilter_stream", "The stream: its input topic", s, registry=r)
        self.info.labels(self.stream).info({"topic": self.topic})
        self.lane_info = Info("skyfilter_lane", "A lane of the stream: its trigger", lane, registry=r)
        self.heartbeat = Gauge("skyfilter_heartbeat_timestamp_seconds",
                               "When the job last looked at its lanes (every second while it lives, idle or not)",
                               s, registry=r)
        self.lane_running = Gauge("skyfilter_lane_running", "1 while the lane's query runs", lane, registry=r)
        self.batches = Counter("skyfilter_batches", "Batches completed (Real-time Mode: checkpoints)", lane,
                               registry=r)
        self.input_alerts = Counter("skyfilter_input_alerts", "Alerts read from Kafka (Real-time Mode: as its "
                                    "tasks read them)", lane, registry=r)
        self.archived = Counter("skyfilter_archived_alerts", "Alerts archived to Delta", s, registry=r)
        self.dead_letters = Counter("skyfilter_dead_letters", "Undecodable messages sent to the dead-letter topic",
                                    lane, registry=r)
        self.filter_matches = Counter("skyfilter_filter_matches", "Delivered alerts each filter matched",
                                      [*lane, "filter"], registry=r)
        self.broker_messages = Counter("skyfilter_broker_messages", "Messages written to each broker's topic",
                                       [*lane, "broker"], registry=r)
        self.broker_capped = Counter("skyfilter_broker_capped", "Matches not sent: over max_alerts_per_visit",
                                     [*s, "broker"], registry=r)
        self.delivery_latency = Histogram(
            "skyfilter_delivery_latency_seconds", "Kafka append time of an input alert to the append time of its "
            "delivery to a broker's topic", [*lane, "broker"], buckets=LATENCY_BUCKETS, registry=r)
        self.filter_seconds = Histogram(
            "skyfilter_filter_seconds", "Seconds a Python filter spent on one micro-batch's alerts (SQL filters run "
            "inside Spark's compiled code, with no time of their own)", [*lane, "filter"],
            buckets=FILTER_BUCKETS, registry=r)
        self.query_restarts = Counter("skyfilter_query_restarts", "Queries started again while the job ran "
                                      "(after a failure it resumes from, a reload, a quarantine)", lane, registry=r)
        self.kafka_outage = Counter("skyfilter_kafka_outage_seconds", "Seconds Kafka did not answer the job", s,
                                    registry=r)
        self.input_rate = Gauge("skyfilter_input_rows_per_second",
                                "Last batch: its alerts over the time since the previous batch started", lane,
                                registry=r)
        self.processed_rate = Gauge("skyfilter_processed_rows_per_second",
                                    "Last batch: its alerts over its processing time", lane, registry=r)
        self.batch_duration = Gauge("skyfilter_batch_duration_seconds", "Last batch: start to end", lane,
                                    registry=r)
        self.deliver_duration = Gauge("skyfilter_batch_deliver_seconds",
                                      "Last delivery batch: start to delivered matches", lane, registry=r)
        self.batch_latency = Gauge("skyfilter_batch_latency_seconds",
                                   "Last batch: Kafka append time of its input alerts to their delivery (delivery "
                                   "lanes) or archiving (archive lane), by statistic (p50, p95, p99, max)",
                                   [*lane, "statistic"], registry=r)
        partition = [*lane, "topic", "partition"]
        self.lag = Gauge("skyfilter_kafka_consumer_lag", "Alerts in Kafka a lane has not read yet, per partition",
                         partition, registry=r)
        self.lag_seconds = Gauge("skyfilter_kafka_consumer_lag_seconds", "How long ago the oldest alert a lane has "
                                 "not read was appended, per partition (0: nothing unread)", partition, registry=r)
        self.quarantined_count = Gauge("skyfilter_quarantined_filters", "Filters quarantined and not running", s,
                                       registry=r)
        self.filter_quarantined = Gauge("skyfilter_filter_quarantined", "1 while this filter is quarantined",
                                        [*s, "filter"], registry=r)
        self.last_batch = Gauge("skyfilter_last_batch_id", "Id of the last completed batch", lane, registry=r)
        self.last_batch_time = Gauge("skyfilter_last_batch_timestamp_seconds", "When the last batch completed",
                                     lane, registry=r)

    def follow(self, log_topic: str) -> DeliveryLogFollower:
        """Hear the stream's delivery log from now on: latency, matches and dead letters as they come."""
        self.follower = DeliveryLogFollower(self.cfg, log_topic)
        self.follower.on("match", self._delivered)
        self.follower.on("dead_letter", lambda record, _ms: self.dead_letters.labels(
            self.stream, record.get("lane") or "delivery").inc())
        return self.follower.start()

    def _delivered(self, record: dict, delivered_ms: int) -> None:
        """One ``match`` record: an alert delivered to its brokers, at the record's own append time."""
        s, lane = self.stream, record.get("lane") or "delivery"
        latency = max(0.0, (delivered_ms - (record.get("kafka_timestamp_ms") or delivered_ms)) / 1000)
        filters: set[str] = set()
        for entry in record.get("brokers") or []:
            broker = entry.get("broker")
            self.delivery_latency.labels(s, lane, broker).observe(latency)
            self.broker_messages.labels(s, lane, broker).inc()
            self.recent.add(broker, latency)
            filters.update((entry.get("filters") or "").split(","))
        for name in filters - {""}:
            self.filter_matches.labels(s, lane, name).inc()

    def _serve(self, port, host: str) -> None:
        if port in (None, "", "null"):
            return
        try:
            self.server, _ = start_http_server(int(port), addr=host, registry=self.registry)
            self.url = f"http://{host}:{self.server.server_port}/metrics"
        except OSError as exc:
            logger.warning(f"metrics endpoint not started: {host}:{port} is not available ({exc.strerror}); "
                           f"set monitoring.port to a free port (the stream runs on without it)")

    def add_lane(self, lane: str, checkpoint: Path, trigger: str, topic: str | None = None,
                 committed: Positions | None = None, rows_read: Callable[[], int] | None = None) -> None:
        """Start watching a lane (its checkpoint, or ``committed(partitions)``, gives its lag on ``topic``, by
        default the input topic; ``rows_read()``, the alerts it has read so far, counts them as they are read)."""
        self.lanes[lane] = LaneState(checkpoint, trigger, topic or self.topic, committed=committed,
                                     rows_read=rows_read)
        self.lane_info.labels(self.stream, lane).info({"trigger": trigger})

    def lag_after(self, lane: str, batch_id: int | None = None) -> dict[int, int]:
        """A lane's lag per partition of the topic it reads now, in alerts, against ``batch_id``'s end offsets (a
        batch reporting its own) or, without it, the lane's best known read positions (see ``add_lane``)."""
        with self.lock:
            self.latest = self.latest or LatestOffsets(self.cfg)
            return self._measure(lane, self.latest, batch_id)

    def _measure(self, lane: str, latest_offsets: LatestOffsets, batch_id: int | None = None,
                 oldest: OldestUnread | None = None) -> dict[int, int]:
        """:meth:`lag_after` with these Kafka clients; with ``oldest``, also the lag in seconds, and the delivery
        and archive positions committed to the stream's consumer groups."""
        state = self.lanes[lane]
        state.lag_at = time.time()
        try:
            latest = latest_offsets(state.topic)
            positions = state.committed(sorted(latest)) if state.committed is not None and batch_id is None \
                else committed_offsets(state.checkpoint, state.topic, batch_id)[1]
            state.lag = lag_per_partition(latest, positions)
            if oldest is not None:
                state.lag_seconds = oldest.seconds_behind(state.topic, positions, state.lag)
                if state.topic == self.topic:
                    self._commit(oldest, consumer_group(self.stream, lane), positions)
        except Exception as exc:  # noqa: BLE001 - SkyfilterError, KafkaException: it costs the lag, not the stream
            logger.warning(f"consumer lag not measured: {exc}")
            return {}
        for partition, behind in state.lag.items():
            self.lag.labels(self.stream, lane, state.topic, str(partition)).set(behind)
        for partition, seconds in state.lag_seconds.items():
            self.lag_seconds.labels(self.stream, lane, state.topic, str(partition)).set(seconds)
        return state.lag

    def _commit(self, oldest: OldestUnread, group: str, positions: dict[int, int]) -> None:
        """Commit a lane's read positions to its consumer group (informational: a failure is said once)."""
        try:
            oldest.commit(group, self.topic, positions)
        except Exception as exc:  # noqa: BLE001 - KafkaException: the group is for kafka_exporter and Burrow only
            if group not in self.commit_failed:
                self.commit_failed.add(group)
                logger.warning(f"consumer group {group}: read positions not committed ({exc}); retried every "
                               f"{self.lag_interval_s:g} s, the stream is not affected")

    def _measure_between_batches(self) -> None:
        """Every ``monitoring.lag_interval_s``, each lane's lag in alerts and seconds, in a thread of its own
        with its own Kafka clients: the job's main loop and the batches never wait for Kafka's answers."""
        latest, oldest = LatestOffsets(self.cfg), OldestUnread(self.cfg)
        try:
            while not self.stopping.wait(self.lag_interval_s):
                for lane in list(self.lanes):
                    self._measure(lane, latest, oldest=oldest)
        finally:
            latest.close()
            oldest.close()

    def batch_figures(self, lane: str, batch_id: int, started: float, finished: float, input_alerts: int,
                      quarantined: list[str]) -> dict:
        """The figures of a batch that the metrics table adds to the lane's own counts."""
        state = self.lanes[lane]
        rates = {"input_rows_per_second": None,
                 "processed_rows_per_second": input_alerts / max(finished - started, 1e-3)}
        if state.previous_start is not None:
            rates["input_rows_per_second"] = input_alerts / max(started - state.previous_start, 1e-3)
        state.previous_start = started
        return {**rates, "kafka_lag": self.lag_after(lane, batch_id), "quarantined_filters": sorted(quarantined)}

    def observe_delivery(self, lane: str, batch_id: int, stats: DeliveryFigures, figures: dict, started: float,
                         delivered: float | None, finished: float, filter_names: list[str]) -> None:
        """Publish one completed batch of a delivery lane (``delivery`` or ``realtime``)."""
        s = self.stream
        self._batch(lane, batch_id, stats.input_alerts, figures, started, finished)
        for name, spent in stats.reports.seconds.items():
            self.filter_seconds.labels(s, lane, name).observe(spent)
        for broker, count in stats.dropped_by_broker.items():
            self.broker_capped.labels(s, broker).inc(count)
        if delivered is not None:
            self.deliver_duration.labels(s, lane).set(delivered - started)
        self._latency(lane, list(stats.latency), stats.latency_max)
        self.show_quarantined(figures["quarantined_filters"], filter_names)
        self.lanes[lane].last_batch.update(matches=stats.matches,
                                           deliver_s=None if delivered is None else delivered - started)

    def observe_archive(self, batch_id: int, stats: dict, figures: dict, started: float, finished: float,
                        latency: list, latency_max: float | None) -> None:
        """Publish one completed batch of the archive lane."""
        self._batch("archive", batch_id, stats["input_alerts"], figures, started, finished)
        self.archived.labels(self.stream).inc(stats["archived"])
        self._latency("archive", latency, latency_max)
        self.lanes["archive"].last_batch.update(archived=stats["archived"])

    def observe_log(self, batch_id: int, records: int, started: float, finished: float) -> None:
        """Publish one completed batch of the archive lane's delivery-log query (``records`` log records)."""
        figures = self.batch_figures("archive-log", batch_id, started, finished, records, [])
        self._batch("archive-log", batch_id, records, figures, started, finished)

    def _batch(self, lane: str, batch_id: int, alerts: int, figures: dict, started: float, finished: float) -> None:
        s = self.stream
        self.batches.labels(s, lane).inc()
        if self.lanes[lane].rows_read is None:
            self.input_alerts.labels(s, lane).inc(alerts)
        if figures["input_rows_per_second"] is not None:
            self.input_rate.labels(s, lane).set(figures["input_rows_per_second"])
        self.processed_rate.labels(s, lane).set(figures["processed_rows_per_second"])
        self.batch_duration.labels(s, lane).set(finished - started)
        self.last_batch.labels(s, lane).set(batch_id)
        self.last_batch_time.labels(s, lane).set(finished)
        self.lanes[lane].last_batch = {"batch_id": batch_id, "finished_at": finished, "alerts": alerts,
                                       "processing_s": finished - started,
                                       "input_rows_per_second": figures["input_rows_per_second"],
                                       "processed_rows_per_second": figures["processed_rows_per_second"]}

    def _latency(self, lane: str, quantiles: list, slowest: float | None) -> None:
        for statistic, value in (*zip(STATISTICS, quantiles, strict=True), ("max", slowest)):
            if value is not None:
                self.batch_latency.labels(self.stream, lane, statistic).set(value / 1000)
        self.lanes[lane].last_batch.update(latency_p50_s=_seconds(quantiles[0]), latency_p99_s=_seconds(quantiles[2]))

    def show_quarantined(self, quarantined: list[str], filter_names: list[str]) -> None:
        """The filters quarantined now (the main loop tells, so a Real-time quarantine shows at once)."""
        s = self.stream
        self.quarantined = sorted(quarantined)
        self.quarantined_count.labels(s).set(len(self.quarantined))
        for name in {*filter_names, *self.quarantined}:
            self.filter_quarantined.labels(s, name).set(1 if name in self.quarantined else 0)

    def restarted(self, lane: str) -> None:
        """A lane's query was started again while the job ran."""
        self.query_restarts.labels(self.stream, lane).inc()

    @property
    def snapshot(self) -> dict:
        """What the status file shows: per lane its trigger, last batch and lag (alerts and seconds); delivery
        latency per broker over the last minute; the quarantined filters."""
        return {"quarantined": self.quarantined, "latency_last_minute": self.recent.per_broker(),
                "lanes": {lane: {"trigger": state.trigger, "topic": state.topic, "checkpoint": str(state.checkpoint),
                                 "last_batch": state.last_batch, "lag": state.lag,
                                 "lag_seconds": state.lag_seconds, "lag_at": state.lag_at}
                          for lane, state in self.lanes.items()}}

    def tick(self, running: dict[str, bool] | None = None, kafka_down: bool = False) -> None:
        """Between batches (the job's main loop): the heartbeat, which lanes run, the alerts read as they are
        read, Kafka's outage time; the first call starts measuring the lag (:meth:`_measure_between_batches`)."""
        now = time.time()
        self.heartbeat.labels(self.stream).set(now)
        for lane, up in (running or {}).items():
            self.lane_running.labels(self.stream, lane).set(1 if up else 0)
        if kafka_down:
            self.kafka_outage.labels(self.stream).inc(now - (self.outage_noted_at or now))
        self.outage_noted_at = now if kafka_down else None
        for lane, state in list(self.lanes.items()):
            if state.rows_read is not None:
                read = state.rows_read()
                self.input_alerts.labels(self.stream, lane).inc(max(0, read - state.rows_counted))
                state.rows_counted = max(read, state.rows_counted)
        if not self.measuring.is_alive():
            self.measuring.start()

    def close(self) -> None:
        """Stop serving (the last values are gone with the process), stop following, close the Kafka clients."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.follower is not None:
            self.follower.stop()
        self.stopping.set()
        if self.measuring.is_alive():
            self.measuring.join(self.lag_interval_s + 15)
        if self.latest is not None:
            self.latest.close()


def _seconds(millis: float | None) -> float | None:
    return None if millis is None else millis / 1000
