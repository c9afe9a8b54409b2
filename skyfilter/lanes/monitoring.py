"""What a running stream tells its operators: Prometheus metrics per lane, and the same figures for Delta.

Every batch of every lane (``delivery``, ``realtime``, ``archive``),
:class:`StreamMonitor` turns the batch's figures into Prometheus series served
at ``http://<monitoring.host>:<monitoring.port>/metrics`` (one registry per
stream, a ``lane`` label on per-lane series) and into the extra columns of the
stream's ``metrics`` table, so a dashboard and a query over the archive read
the same numbers.  Between batches it refreshes each lane's consumer lag, so a
stalled lane shows a growing lag even when no batch completes.  A taken port or
an unreachable Kafka costs the metrics, never the stream: one line is logged.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, start_http_server

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.figures import DeliveryFigures
from skyfilter.core.lag import LatestOffsets, committed_offsets, lag_per_partition

QUANTILES = {"0.5": 0, "0.95": 1, "0.99": 2}


@dataclass
class LaneState:
    """What the monitor knows of one lane: where its checkpoint is, its last batch, its lag."""

    checkpoint: Path
    trigger: str
    topic: str                    # what the lane's query reads (its lag is measured on it)
    previous_start: float | None = None
    last_batch: dict = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    lag_at: float = 0.0
    committed: Callable[[list[int]], dict[int, int]] | None = None  # the lane's read offsets, when not checkpointed


class StreamMonitor:
    """The metrics of one stream's lanes: updated per batch, served over HTTP when ``monitoring.port`` is set."""

    def __init__(self, cfg: Config, stream: str, topic: str, log=print):
        self.cfg = cfg
        self.stream = stream
        self.topic = topic
        self.log = log
        self.run_id = uuid.uuid4().hex[:12]
        self.lanes: dict[str, LaneState] = {}
        self.lag_interval_s = cfg.monitoring.lag_interval_s
        self.latest: LatestOffsets | None = None
        self.server = None
        self.url: str | None = None
        self.lock = threading.Lock()  # batch threads, the listener and the job's main loop all refresh the lag
        self.quarantined: list[str] = []
        self.registry = CollectorRegistry()
        self._define()
        self._serve(cfg.monitoring.port, cfg.monitoring.host)

    def _define(self) -> None:
        r, s, lane = self.registry, ["stream"], ["stream", "lane"]
        self.info = Info("skyfilter_stream", "The stream: its input topic", s, registry=r)
        self.info.labels(self.stream).info({"topic": self.topic})
        self.lane_info = Info("skyfilter_lane", "A lane of the stream: its trigger", lane, registry=r)
        self.batches = Counter("skyfilter_batches", "Batches completed", lane, registry=r)
        self.input_alerts = Counter("skyfilter_input_alerts", "Alerts read from Kafka", lane, registry=r)
        self.archived = Counter("skyfilter_archived_alerts", "Alerts archived to Delta", s, registry=r)
        self.dead_letters = Counter("skyfilter_dead_letters", "Undecodable messages sent to the dead-letter topic",
                                    s, registry=r)
        self.filter_matches = Counter("skyfilter_filter_matches", "Alerts each filter accepted",
                                      [*s, "filter"], registry=r)
        self.broker_messages = Counter("skyfilter_broker_messages", "Messages written to each broker's topic",
                                       [*s, "broker"], registry=r)
        self.broker_capped = Counter("skyfilter_broker_capped", "Matches not sent: over max_alerts_per_visit",
                                     [*s, "broker"], registry=r)
        self.input_rate = Gauge("skyfilter_input_rows_per_second",
                                "Last batch: its alerts over the time since the previous batch started", lane,
                                registry=r)
        self.processed_rate = Gauge("skyfilter_processed_rows_per_second",
                                    "Last batch: its alerts over its processing time", lane, registry=r)
        self.batch_duration = Gauge("skyfilter_batch_duration_seconds", "Last batch: start to end", lane,
                                    registry=r)
        self.deliver_duration = Gauge("skyfilter_batch_deliver_seconds",
                                      "Last delivery batch: start to delivered matches", lane, registry=r)
        self.latency = Gauge("skyfilter_alert_latency_seconds",
                             "Last batch: Kafka append time of an input alert to its delivery (delivery lanes) or "
                             "to its archiving (archive lane), by quantile (1 = the slowest alert)",
                             [*lane, "quantile"], registry=r)
        self.lag = Gauge("skyfilter_kafka_consumer_lag", "Alerts in Kafka a lane has not processed yet, per partition",
                         [*lane, "topic", "partition"], registry=r)
        self.quarantined_count = Gauge("skyfilter_quarantined_filters", "Filters quarantined and not running", s,
                                       registry=r)
        self.filter_quarantined = Gauge("skyfilter_filter_quarantined", "1 while this filter is quarantined",
                                        [*s, "filter"], registry=r)
        self.last_batch = Gauge("skyfilter_last_batch_id", "Id of the last completed batch", lane, registry=r)
        self.last_batch_time = Gauge("skyfilter_last_batch_timestamp_seconds", "When the last batch completed",
                                     lane, registry=r)

    def _serve(self, port, host: str) -> None:
        if port in (None, "", "null"):
            return
        try:
            self.server, _ = start_http_server(int(port), addr=host, registry=self.registry)
            self.url = f"http://{host}:{self.server.server_port}/metrics"
        except OSError as exc:
            self.log(f"metrics endpoint not started: {host}:{port} is not available ({exc.strerror}); "
                     f"set monitoring.port to a free port (the stream runs on without it)")

    def add_lane(self, lane: str, checkpoint: Path, trigger: str, topic: str | None = None,
                 committed: Callable[[list[int]], dict[int, int]] | None = None) -> None:
        """Start watching a lane (its checkpoint, or ``committed(partitions)``, gives its lag on ``topic``, by
        default the input topic)."""
        self.lanes[lane] = LaneState(checkpoint, trigger, topic or self.topic, committed=committed)
        self.lane_info.labels(self.stream, lane).info({"trigger": trigger})

    def lag_after(self, lane: str, batch_id: int | None = None) -> dict[int, int]:
        """A lane's lag per partition of the topic it reads now, against a batch's end offsets (default: its
        last committed batch)."""
        with self.lock:
            state = self.lanes[lane]
            state.lag_at = time.time()
            try:
                self.latest = self.latest or LatestOffsets(self.cfg)
                latest = self.latest(state.topic)
            except SkyfilterError as exc:
                self.log(f"consumer lag not measured: {exc}")
                return {}
            committed = state.committed(sorted(latest)) if state.committed is not None else \
                committed_offsets(state.checkpoint, state.topic, batch_id)[1]
            state.lag = lag_per_partition(latest, committed)
            for partition, behind in state.lag.items():
                self.lag.labels(self.stream, lane, state.topic, str(partition)).set(behind)
            return state.lag

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
        self.dead_letters.labels(s).inc(stats.rejected)
        for name, count in stats.by_filter.items():
            self.filter_matches.labels(s, name).inc(count)
        for broker, count in stats.by_broker.items():
            self.broker_messages.labels(s, broker).inc(count)
        for broker, count in stats.dropped_by_broker.items():
            self.broker_capped.labels(s, broker).inc(count)
        if delivered is not None:
            self.deliver_duration.labels(s, lane).set(delivered - started)
        self._latency(lane, list(stats.latency), stats.latency_max)
        self.quarantined = figures["quarantined_filters"]
        self.quarantined_count.labels(s).set(len(self.quarantined))
        for name in {*filter_names, *self.quarantined}:
            self.filter_quarantined.labels(s, name).set(1 if name in self.quarantined else 0)
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
        for quantile, index in QUANTILES.items():
            if quantiles[index] is not None:
                self.latency.labels(self.stream, lane, quantile).set(quantiles[index] / 1000)
        if slowest is not None:
            self.latency.labels(self.stream, lane, "1").set(slowest / 1000)
        self.lanes[lane].last_batch.update(latency_p50_s=_seconds(quantiles[0]), latency_p99_s=_seconds(quantiles[2]))

    @property
    def snapshot(self) -> dict:
        """What the status file shows: per lane its trigger, last batch and lag; the quarantined filters."""
        return {"quarantined": self.quarantined,
                "lanes": {lane: {"trigger": state.trigger, "topic": state.topic, "checkpoint": str(state.checkpoint),
                                 "last_batch": state.last_batch, "lag": state.lag, "lag_at": state.lag_at}
                          for lane, state in self.lanes.items()}}

    def tick(self) -> None:
        """Between batches: refresh each lane's consumer lag every ``monitoring.lag_interval_s``."""
        for lane, state in list(self.lanes.items()):
            if time.time() - state.lag_at >= self.lag_interval_s:
                self.lag_after(lane)

    def close(self) -> None:
        """Stop serving (the last values are gone with the process) and close the Kafka consumer."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.latest is not None:
            self.latest.close()


def _seconds(millis: float | None) -> float | None:
    return None if millis is None else millis / 1000
