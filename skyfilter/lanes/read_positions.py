"""How far behind a lane is, per input partition: in alerts, and in seconds of the oldest alert it has not read.

A lane's read position is the best one known: where a Real-time query's tasks
have read to (their read marks, ``skyfilter/spark/jvm/ReadMarks.java``), else a
delta-rs writer's committed offsets, else the lane's checkpoint.  The age of
the oldest unread alert is its Kafka append time, fetched from Kafka for the
partitions that lag.  The delivery position is also committed to a Kafka
consumer group named after the stream, so that kafka_exporter and Burrow see
it too; Spark never reads those offsets back (its checkpoint is the truth), so
the group is informational.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.lag import committed_offsets
from skyfilter.kafka.topics import admin_client

Positions = Callable[[list[int]], dict[int, int]]  # partitions -> the lane's next offset to read in each


def consumer_group(stream: str, lane: str) -> str:
    """The consumer group a lane's read positions are committed to: ``skyfilter.<stream>`` for delivery,
    ``skyfilter.<stream>.<lane>`` for the others."""
    return f"skyfilter.{stream}" if lane in ("realtime", "delivery") else f"skyfilter.{stream}.{lane}"


def start_positions(checkpoint: Path, topic: str, latest: dict[int, int], starting_offsets: str) -> dict[int, int]:
    """Where a lane starts reading: its checkpoint's last committed batch's end offsets, else (a new stream name)
    the offsets the stream settled on (``stream.starting_offsets``: the topic's ``latest``, a Spark offsets JSON
    such as ``auto`` settles to, or the partitions' beginnings)."""
    committed = committed_offsets(checkpoint, topic)[1]
    if committed:
        return committed
    if starting_offsets.strip().startswith("{"):  # Spark's -1: the latest offset, -2: the earliest
        given = {int(p): int(o) for p, o in json.loads(starting_offsets).get(topic, {}).items()}
        return {p: latest.get(p, 0) if o == -1 else max(o, 0) for p, o in given.items()}
    return dict(latest) if starting_offsets == "latest" else {}


def marked_positions(marks: Callable[[], dict[tuple[str, int], tuple[int, int, int]]], topic: str,
                     started: dict[int, int], checkpoint: Path) -> Positions:
    """Positions from read marks ((topic, partition) -> (next offset, ...)); where none was made yet, the later
    of where the lane ``started`` and its checkpoint."""
    def positions(_partitions: list[int]) -> dict[int, int]:
        known = dict(started)
        for partition, offset in committed_offsets(checkpoint, topic)[1].items():
            known[partition] = max(offset, known.get(partition, 0))
        for (name, partition), mark in marks().items():
            if name == topic:
                known[partition] = max(mark[0], known.get(partition, 0))
        return known
    return positions


def past_checkpoint(positions: dict[int, int], checkpoint: Path, topic: str, started: dict[int, int]) -> int:
    """Alerts read past what ``checkpoint`` last committed (where nothing was committed, past where the lane
    ``started``): what a Real-time query has read, and its checkpoints not yet counted."""
    committed = committed_offsets(checkpoint, topic)[1] or started
    return sum(max(0, offset - committed.get(partition, started.get(partition, 0)))
               for partition, offset in positions.items())


def read_to(positions: dict[int, int], ends: dict[int, int]) -> bool:
    """Whether ``positions`` reach ``ends`` (partition -> offset) in every partition."""
    return all(positions.get(partition, 0) >= end for partition, end in ends.items())


class OldestUnread:
    """The Kafka append time of the first unread alert of lagging partitions, and the group commits."""

    def __init__(self, cfg: Config):
        from confluent_kafka import Consumer

        self.cfg = cfg
        self.consumer = Consumer(client_settings(cfg, **{
            "group.id": f"skyfilter-oldest-{uuid.uuid4()}", "enable.auto.commit": False, "log_level": 0,
            "fetch.wait.max.ms": 50, "max.partition.fetch.bytes": 65536}))
        self.admin = None  # an AdminClient, made on the first commit

    def seconds_behind(self, topic: str, positions: dict[int, int], lag: dict[int, int], timeout_s: float = 2.0
                       ) -> dict[int, float]:
        """Per partition: 0 when nothing is unread, else how long ago the first unread alert was appended."""
        from confluent_kafka import TopicPartition

        behind = {partition: 0.0 for partition, waiting in lag.items() if not waiting}
        lagging = [TopicPartition(topic, p, positions.get(p, 0)) for p, waiting in lag.items() if waiting]
        if not lagging:
            return behind
        self.consumer.assign(lagging)
        deadline, now = time.monotonic() + timeout_s, time.time()
        try:
            while len(behind) < len(lag) and time.monotonic() < deadline:
                for message in self.consumer.consume(len(lagging), 0.2):
                    if message.error() is None and message.partition() not in behind:
                        behind[message.partition()] = max(0.0, now - message.timestamp()[1] / 1000)
        finally:
            self.consumer.unassign()
        return behind

    def commit(self, group: str, topic: str, positions: dict[int, int], timeout_s: float = 5.0) -> None:
        """Set ``group``'s offsets of ``topic`` to ``positions`` (Kafka's admin API: no member joins the group)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        if not positions:
            return
        self.admin = self.admin or admin_client(self.cfg)
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o)
                                                       for p, o in sorted(positions.items())])
        self.admin.alter_consumer_group_offsets([request], request_timeout=timeout_s)[group].result(timeout_s)

    def close(self) -> None:
        self.consumer.close()
