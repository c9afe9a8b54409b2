"""Delivery latency over the last minute, per broker: what ``skyfilter status`` shows beside Prometheus' histograms."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

WINDOW_S = 60.0
LATENCY_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)  # seconds


class RecentLatency:
    """The latencies of the deliveries of the last ``window_s`` seconds (fed from the delivery log's thread)."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.seen: deque[tuple[float, str, float]] = deque()  # (when heard, broker, latency in s)
        self.lock = threading.Lock()

    def add(self, broker: str, latency_s: float, now: float | None = None) -> None:
        with self.lock:
            self.seen.append((time.time() if now is None else now, broker, latency_s))

    def per_broker(self, now: float | None = None) -> dict[str, dict[str, float]]:
        """Per broker: deliveries, p50 and p99 (seconds) over the window ending ``now``."""
        now = time.time() if now is None else now
        with self.lock:
            while self.seen and self.seen[0][0] < now - self.window_s:
                self.seen.popleft()
            latencies: dict[str, list[float]] = {}
            for _, broker, latency in self.seen:
                latencies.setdefault(broker, []).append(latency)
        return {broker: {"deliveries": len(values), "p50_s": float(np.percentile(values, 50)),
                         "p99_s": float(np.percentile(values, 99))}
                for broker, values in sorted(latencies.items())}
