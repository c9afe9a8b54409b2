"""Kafka reachability around a streaming query: wait at start-up, say so when it goes away.

Spark's Kafka source blocks quietly while no broker answers and resumes from
its checkpoint when one does, so an outage loses nothing; but a quiet stream
looks like a hung one.  The watch logs one line when Kafka stops answering,
one when it is back (with how long it was away), and stops the job with a
clear error when an outage lasts longer than ``kafka.outage_limit_s``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaException

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.lag import LatestOffsets, committed_offsets
from skyfilter.kafka.topics import admin_client, check_reachable

logger = logging.getLogger(__name__)


def wait_until_reachable(cfg: Config, wait_s: float) -> None:
    """Return once Kafka answers; after ``wait_s`` seconds of trying, raise the one-line error."""
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        try:
            check_reachable(cfg, timeout=5.0)
            if announced:
                logger.info(f"Kafka at {cfg.bootstrap_servers} answers: starting")
            return
        except SkyfilterError:
            if time.monotonic() >= deadline:
                raise
            if not announced:
                logger.info(f"Kafka at {cfg.bootstrap_servers} does not answer yet: retrying every 5 s for up to "
                            f"{wait_s:.0f} s (kafka.connect_wait_s)")
                announced = True
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))


class KafkaWatch:
    """A daemon thread that probes Kafka every ``interval_s`` seconds while a query runs."""

    def __init__(self, cfg: Config, interval_s: float = 5.0):
        self.cfg = cfg
        self.interval_s = interval_s
        self.limit_s = cfg.kafka.outage_limit_s
        self.down_since: float | None = None
        self.back_at = 0.0  # wall-clock time Kafka last came back (0: never away)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-watch", daemon=True)

    def start(self) -> KafkaWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def outage_s(self) -> float:
        """How long Kafka has been unreachable (0 while it answers)."""
        return 0.0 if self.down_since is None else time.monotonic() - self.down_since

    def over_limit(self) -> SkyfilterError | None:
        """The error to stop with once an outage lasts longer than the limit."""
        if self.down_since is None or self.outage_s() <= self.limit_s:
            return None
        return SkyfilterError(f"Kafka at {self.cfg.bootstrap_servers} has not answered for {self.outage_s():.0f} s "
                              f"(kafka.outage_limit_s = {self.limit_s:.0f}): stopping; the checkpoint keeps every "
                              f"offset, so starting the job again resumes where it stopped")

    def _run(self) -> None:
        admin = admin_client(self.cfg)
        while not self._stop.wait(self.interval_s):
            try:
                admin.list_topics(timeout=min(self.interval_s, 5.0))
                reachable = True
            except KafkaException:
                reachable = False
            if not reachable and self.down_since is None:
                self.down_since = time.monotonic()
                logger.warning(f"Kafka at {self.cfg.bootstrap_servers} is unreachable: the stream waits and resumes "
                               f"from its checkpoint when it returns (stops after {self.limit_s:.0f} s)")
            elif reachable and self.down_since is not None:
                away = time.monotonic() - self.down_since
                self.down_since = None
                self.back_at = time.time()
                logger.info(f"Kafka at {self.cfg.bootstrap_servers} is reachable again after {away:.0f} s: resuming")


class InputArrivals:
    """When the input topic last grew, from Kafka's latest offsets.

    A Real-time query reports the alerts it read only at its checkpoints
    (minutes apart), so the job's idle stop asks Kafka instead: alerts that
    arrived within the last ``idle_s`` keep the stream running.  ``waiting``:
    the messages past the query's checkpoint when the watch starts (a backlog
    it reads now counts as alerts arriving now).
    """

    def __init__(self, cfg: Config, topic: str, waiting: int = 0, interval_s: float = 2.0):
        self.topic = topic
        self.interval_s = interval_s
        self.latest = LatestOffsets(cfg)
        self.ends: dict[int, int] | None = None
        self.checked_at = 0.0
        self.grew_at = time.time() if waiting else 0.0

    @property
    def has_baseline(self) -> bool:
        """Whether Kafka has answered once: growth is seen only against a reading."""
        return self.ends is not None

    def last_growth(self) -> float:
        """The time (``time.time()``) the topic was last seen to grow; 0 before it grew under this watch.

        A reading that fails, or misses partitions (metadata not yet settled), keeps what is known: only a
        partition's end moving forward, or a new partition, counts as growth."""
        if time.monotonic() - self.checked_at >= self.interval_s:
            self.checked_at = time.monotonic()
            try:
                ends = self.latest(self.topic)
            except SkyfilterError:
                return self.grew_at  # Kafka away: the KafkaWatch says so and holds the idle stop
            if ends and self.ends is not None and any(end > self.ends.get(p, 0) for p, end in ends.items()):
                self.grew_at = time.time()
            if ends:
                self.ends = {**(self.ends or {}), **ends}
        return self.grew_at

    def close(self) -> None:
        self.latest.close()


def offsets_past_checkpoint(cfg: Config, checkpoint: Path, topic: str) -> int:
    """Messages of ``topic`` past the offsets a query's ``checkpoint`` last committed (or its starting offsets):
    what arrived for a Real-time Mode query before this run counts arrivals (0 when Kafka does not answer)."""
    _, committed = committed_offsets(checkpoint, topic)
    if not committed:
        started = str(cfg.stream.starting_offsets)
        committed = {int(p): int(o) for p, o in json.loads(started).get(topic, {}).items()} \
            if started.startswith("{") else {}
    latest = LatestOffsets(cfg)
    try:
        ends = latest(topic)
    except SkyfilterError:
        return 0
    finally:
        latest.close()
    return sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())
