"""What a running stream tells its operators: Prometheus metrics, and the same figures for the Delta table.

Every batch, :class:`StreamMonitor` turns the batch's figures into
Prometheus series served at ``http://<monitoring.host>:<monitoring.port>/metrics``
(one registry per stream) and into the extra columns of the stream's
``metrics`` table, so a dashboard and a query over the archive read the
same numbers.  Between batches it refreshes the consumer lag, so a stalled
stream shows a growing lag even when no batch completes.  A taken port or an
unreachable Kafka costs the metrics, never the stream: one line is logged.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, start_http_server

from skyfilter.config import Config
from skyfilter.errors import SkyfilterError
from skyfilter.lag import LatestOffsets, committed_offsets, lag_per_partition

QUANTILES = {"0.5": 0, "0.95": 1, "0.99": 2}


class StreamMonitor:
    """The metrics of one stream: updated per batch, served over HTTP when ``monitoring.port`` is set."""

    def __init__(self, cfg: Config, stream: str, topic: str, checkpoint: Path, trigger: str, log=print):
        self.cfg = cfg
        self.stream = stream
        self.topic = topic
        self.checkpoint = checkpoint
        self.log = log
        self.lag_interval_s = float(cfg.get("monitoring.lag_interval_s", 10))
        self.previous_start: float | None = None
        self.lag_checked_at = 0.0
        self.latest: LatestOffsets | None = None
        self.server = None
        self.url: str | None = None
        self.lock = threading.Lock()  # the batch thread and the job's main loop both refresh the lag
        self.snapshot: dict = {}
        self.registry = CollectorRegistry()
        self._define(trigger)
        self._serve(cfg.get("monitoring.port", None), str(cfg.get("monitoring.host", "127.0.0.1")))

    def _define(self, trigger: str) -> None:
        r, s = self.registry, ["stream"]
        Info("skyfilter_stream", "The stream: its input topic and trigger", s, registry=r).labels(self.stream).info(
            {"topic": self.topic, "trigger": trigger})
        self.batches = Counter("skyfilter_batches", "Micro-batches completed", s, registry=r)
        self.input_alerts = Counter("skyfilter_input_alerts", "Alerts read from Kafka", s, registry=r)
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
                                "Last batch: its alerts over the time since the previous batch started", s, registry=r)
        self.processed_rate = Gauge("skyfilter_processed_rows_per_second",
                                    "Last batch: its alerts over its processing time", s, registry=r)
        self.batch_duration = Gauge("skyfilter_batch_duration_seconds", "Last batch: start to end, archive included",
                                    s, registry=r)
        self.deliver_duration = Gauge("skyfilter_batch_deliver_seconds", "Last batch: start to delivered matches",
                                      s, registry=r)
        self.latency = Gauge("skyfilter_alert_latency_seconds",
                             "Last batch: Kafka append time of an input alert to its delivery, by quantile "
                             "(1 = the slowest alert)", [*s, "quantile"], registry=r)
        self.lag = Gauge("skyfilter_kafka_consumer_lag", "Alerts in Kafka not yet processed, per partition",
                         [*s, "topic", "partition"], registry=r)
        self.quarantined = Gauge("skyfilter_quarantined_filters", "Filters quarantined and not running", s,
                                 registry=r)
        self.filter_quarantined = Gauge("skyfilter_filter_quarantined", "1 while this filter is quarantined",
                                        [*s, "filter"], registry=r)
        self.last_batch = Gauge("skyfilter_last_batch_id", "Id of the last completed batch", s, registry=r)
        self.last_batch_time = Gauge("skyfilter_last_batch_timestamp_seconds", "When the last batch completed",
                                     s, registry=r)

    def _serve(self, port, host: str) -> None:
        if port in (None, "", "null"):
            return
        try:
            self.server, _ = start_http_server(int(port), addr=host, registry=self.registry)
            self.url = f"http://{host}:{self.server.server_port}/metrics"
        except OSError as exc:
            self.log(f"metrics endpoint not started: {host}:{port} is not available ({exc.strerror}); "
                     f"set monitoring.port to a free port (the stream runs on without it)")

    def lag_after(self, batch_id: int | None = None) -> dict[int, int]:
        """Consumer lag per partition now, against a batch's end offsets (the last committed batch by default)."""
        with self.lock:
            self.lag_checked_at = time.time()
            try:
                self.latest = self.latest or LatestOffsets(self.cfg)
                latest = self.latest(self.topic)
            except SkyfilterError as exc:
                self.log(f"consumer lag not measured: {exc}")
                return {}
            _, committed = committed_offsets(self.checkpoint, self.topic, batch_id)
            lag = lag_per_partition(latest, committed)
            for partition, behind in lag.items():
                self.lag.labels(self.stream, self.topic, str(partition)).set(behind)
            self.snapshot = {**self.snapshot, "lag": lag, "lag_at": self.lag_checked_at}
            return lag

    def batch_figures(self, batch_id: int, started: float, finished: float, input_alerts: int,
                      quarantined: list[str]) -> dict:
        """The figures of a batch that the metrics table adds to the stream's own counts."""
        rates = {"input_rows_per_second": None,
                 "processed_rows_per_second": input_alerts / max(finished - started, 1e-3)}
        if self.previous_start is not None:
            rates["input_rows_per_second"] = input_alerts / max(started - self.previous_start, 1e-3)
        self.previous_start = started
        return {**rates, "kafka_lag": self.lag_after(batch_id), "quarantined_filters": sorted(quarantined)}

    def observe(self, batch_id: int, stats: dict, figures: dict, started: float, delivered: float,
                finished: float, filter_names: list[str]) -> None:
        """Publish one completed batch."""
        s = self.stream
        self.batches.labels(s).inc()
        self.input_alerts.labels(s).inc(stats["input_alerts"])
        self.archived.labels(s).inc(stats["archived"])
        self.dead_letters.labels(s).inc(stats["rejected"])
        for name, count in stats["by_filter"].items():
            self.filter_matches.labels(s, name).inc(count)
        for broker, count in stats["by_broker"].items():
            self.broker_messages.labels(s, broker).inc(count)
        for broker, count in stats["dropped_by_broker"].items():
            self.broker_capped.labels(s, broker).inc(count)
        if figures["input_rows_per_second"] is not None:
            self.input_rate.labels(s).set(figures["input_rows_per_second"])
        self.processed_rate.labels(s).set(figures["processed_rows_per_second"])
        self.batch_duration.labels(s).set(finished - started)
        self.deliver_duration.labels(s).set(delivered - started)
        for quantile, index in QUANTILES.items():
            if stats["latency"][index] is not None:
                self.latency.labels(s, quantile).set(stats["latency"][index] / 1000)
        if stats["latency_max"] is not None:
            self.latency.labels(s, "1").set(stats["latency_max"] / 1000)
        self.quarantined.labels(s).set(len(figures["quarantined_filters"]))
        for name in {*filter_names, *figures["quarantined_filters"]}:
            self.filter_quarantined.labels(s, name).set(1 if name in figures["quarantined_filters"] else 0)
        self.last_batch.labels(s).set(batch_id)
        self.last_batch_time.labels(s).set(finished)
        self.snapshot = {**self.snapshot, "quarantined": figures["quarantined_filters"],
                         "last_batch": {"batch_id": batch_id, "finished_at": finished, "alerts": stats["input_alerts"],
                                        "matches": stats["matches"], "deliver_s": delivered - started,
                                        "processing_s": finished - started,
                                        "latency_p50_s": _seconds(stats["latency"][0]),
                                        "latency_p99_s": _seconds(stats["latency"][2]),
                                        "input_rows_per_second": figures["input_rows_per_second"],
                                        "processed_rows_per_second": figures["processed_rows_per_second"]}}

    def tick(self) -> None:
        """Between batches: refresh the consumer lag every ``monitoring.lag_interval_s``."""
        if time.time() - self.lag_checked_at >= self.lag_interval_s:
            self.lag_after()

    def close(self) -> None:
        """Stop serving (the last values are gone with the process) and close the Kafka consumer."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.latest is not None:
            self.latest.close()


def _seconds(millis: float | None) -> float | None:
    return None if millis is None else millis / 1000
