"""Reading a topic back: what a downstream broker receives, and the end-to-end latency it saw."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings


@dataclass
class Delivered:
    """One message as a consumer sees it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def latency_ms(self) -> float | None:
        """Output append time minus the input append time carried in the ``input_time`` header."""
        sent = self.headers.get("input_time")
        return None if sent is None else float(self.timestamp_ms - int(sent))


def watermarks(consumer: Consumer, partition: TopicPartition, wait_s: float = 15.0,
               timeout_s: float = 10.0) -> tuple[int, int]:
    """Low and high offsets, asking again for ``wait_s`` while Kafka says the partition has no leader yet: a
    just-created topic gets its leader known everywhere a moment later (even on one broker)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            transient = error.retriable() or error.code() in (KafkaError._UNKNOWN_PARTITION,
                                                              KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                              KafkaError.NOT_LEADER_FOR_PARTITION,
                                                              KafkaError.LEADER_NOT_AVAILABLE)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_topic(cfg: Config, topic: str, timeout: float = 30.0, group: str | None = None) -> list[Delivered]:
    """Every message currently in a topic (all partitions, from the beginning), in partition/offset order.

    ``group`` names the consumer group (on a secure cluster a broker may only use
    its own); nothing is committed to it.
    """
    consumer = Consumer(client_settings(cfg, **{
        "group.id": group or f"skyfilter-reader-{uuid.uuid4()}", "enable.auto.commit": False, "log_level": 0,
        "fetch.max.bytes": 64 * 1024 * 1024}))
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        info = metadata.topics.get(topic)
        if info is not None and info.error is not None and info.error.name() != "UNKNOWN_TOPIC_OR_PART":
            raise SkyfilterError(f"cannot read topic '{topic}' at {cfg.bootstrap_servers}: {info.error.str()}")
        if info is None or info.error is not None:
            return []
        ends = {}
        for partition in info.partitions:
            low, high = watermarks(consumer, TopicPartition(topic, partition))
            if high > low:
                ends[partition] = (low, high)
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        messages: list[Delivered] = []
        remaining = {p: high for p, (_, high) in ends.items()}
        while remaining:
            message = consumer.poll(timeout)
            if message is None:
                raise SkyfilterError(f"timed out reading topic '{topic}' at {cfg.bootstrap_servers}")
            if message.error():
                raise SkyfilterError(f"reading topic '{topic}': {message.error().str()}")
            messages.append(Delivered(
                message.topic(), message.partition(), message.offset(), message.timestamp()[1], message.key(),
                message.value(), {k: (v or b"").decode() for k, v in (message.headers() or [])}))
            if message.offset() + 1 >= remaining.get(message.partition(), 0):
                remaining.pop(message.partition(), None)
        return sorted(messages, key=lambda m: (m.partition, m.offset))
    except KafkaException as exc:
        raise SkyfilterError(f"cannot read topic '{topic}' at {cfg.bootstrap_servers}: {exc.args[0].str()}") from None
    finally:
        consumer.close()


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
