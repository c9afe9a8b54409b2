"""The figures of one delivery batch, as values: what the log, the metrics, the totals and quarantine read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FilterReports:
    """What a batch's Python filters reported: each failing filter's error and a sample alert, each one's time."""

    errors: dict[str, str] = field(default_factory=dict)
    samples: dict[str, str] = field(default_factory=dict)  # filter -> the id of an alert it failed on
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DeliveryFigures:
    """One delivery batch (micro-batch, or a Real-time checkpoint interval), made once when it is over."""

    input_alerts: int
    rejected: int  # messages that could not be decoded (dead letters)
    latency: tuple[float | None, float | None, float | None]  # p50, p95, p99 in ms (None: not measured)
    latency_max: float | None
    by_filter: dict[str, int]  # alerts each filter matched
    by_broker: dict[str, int]  # messages each broker was sent, after its cap
    dropped_by_broker: dict[str, int]  # matches each broker's cap kept back (only brokers with some)
    matches: int  # messages sent in all
    reports: FilterReports = field(default_factory=FilterReports)
