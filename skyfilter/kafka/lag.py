"""Consumer lag of a stream: Kafka's latest offsets minus the offsets its checkpoint has committed.

Spark's Kafka source keeps no consumer-group offsets in Kafka; the truth is
the stream's checkpoint (``offsets/<batch>`` holds each batch's end offsets,
``commits/<batch>`` marks it done).  Reading both needs neither Spark nor the
running job, so `skyfilter status` and the job's own metrics agree.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings


def last_batch(folder: Path) -> int | None:
    """The highest batch number of a checkpoint's ``offsets`` or ``commits`` folder."""
    numbers = [int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()]
    return max(numbers) if numbers else None


def committed_offsets(checkpoint: Path, topic: str | None, batch_id: int | None = None
                      ) -> tuple[int | None, dict[int, int]]:
    """(batch id, end offset per partition) of a batch in a checkpoint; the last committed batch by default.

    ``batch_id`` names a batch that is planned but still running (its
    ``offsets`` file is written before the batch starts); ``topic`` None
    takes the checkpoint's first source topic.
    """
    batch = batch_id if batch_id is not None else last_batch(checkpoint / "commits")
    if batch is None:
        return None, {}
    for name, partitions in _source_offsets(checkpoint / "offsets" / str(batch)).items():
        if topic in (None, name):
            return batch, {int(p): int(o) for p, o in partitions.items()}
    return batch, {}


def _source_offsets(path: Path) -> dict[str, dict[str, int]]:
    """Topic -> partition -> end offset of one ``offsets`` file (a version line, batch metadata, one line
    per source); empty when the file is missing or half-written."""
    try:
        lines = path.read_text().splitlines()[2:]
        return {name: parts for line in lines if line.startswith("{") for name, parts in json.loads(line).items()}
    except (OSError, ValueError):
        return {}


class LatestOffsets:
    """Kafka's latest (high watermark) offset per partition of a topic, through one reused consumer."""

    def __init__(self, cfg: Config):
        from confluent_kafka import Consumer

        self.cfg = cfg
        self.consumer = Consumer(client_settings(cfg, **{"group.id": f"skyfilter-lag-{uuid.uuid4()}",
                                                         "enable.auto.commit": False, "log_level": 0}))

    def __call__(self, topic: str, timeout_s: float = 5.0) -> dict[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        from skyfilter.kafka.read_back import watermarks

        try:
            info = self.consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if info is None or info.error is not None:
                return {}
            return {p: watermarks(self.consumer, TopicPartition(topic, p), wait_s=timeout_s, timeout_s=timeout_s)[1]
                    for p in info.partitions}
        except KafkaException as exc:
            raise SkyfilterError(f"cannot read the latest offsets of '{topic}' at {self.cfg.bootstrap_servers}: "
                                 f"{exc.args[0].str()}") from None

    def at(self, topic: str, timestamp_ms: int, timeout_s: float = 5.0) -> dict[int, int]:
        """Per partition, the offset of the first message appended at or after ``timestamp_ms`` (the end of the
        partition when none was)."""
        from confluent_kafka import KafkaException, TopicPartition

        ends = self(topic, timeout_s)
        try:
            found = self.consumer.offsets_for_times([TopicPartition(topic, p, int(timestamp_ms)) for p in ends],
                                                    timeout=timeout_s)
        except KafkaException as exc:
            raise SkyfilterError(f"cannot look up the offsets of '{topic}' at a time at {self.cfg.bootstrap_servers}: "
                                 f"{exc.args[0].str()}") from None
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}

    def close(self) -> None:
        self.consumer.close()


def lag_per_partition(latest: dict[int, int], committed: dict[int, int]) -> dict[int, int]:
    """Alerts in Kafka that the stream has not processed yet, per partition (never negative)."""
    return {p: max(0, high - committed.get(p, 0)) for p, high in sorted(latest.items())}


def checkpoint_topic(checkpoint: Path) -> str | None:
    """The Kafka topic a stream's checkpoint reads (from its newest ``offsets`` file)."""
    batch = last_batch(checkpoint / "offsets")
    return None if batch is None else next(iter(_source_offsets(checkpoint / "offsets" / str(batch))), None)
