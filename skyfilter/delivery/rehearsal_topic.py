"""The private topic a Real-time stream rehearses its night on before it says ``running:``.

The rehearsal runs the night's own query (same filters, same sinks, same
Real-time trigger) on alerts like the night's: the input topic's latest
messages, copied here, topped up with probe alerts when the topic holds fewer.
Spark then finds the night's generated classes in its code cache and the JIT
has compiled the paths the night's alerts take (decode, the filters that match,
the broker encodings, the Kafka writes), not only those of probe alerts that
match nothing.  The topic is read by the rehearsal alone, under the input
topic's prefix (the stream's principal may write there on a secure cluster),
with a short retention: nobody else reads it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from skyfilter.core.config import Config
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.read_back import watermarks
from skyfilter.kafka.topics import ensure_topics, topic_partitions

RETENTION_MS = 60_000  # what a rehearsal reads is read once, at once
POLL_S = 0.5


@dataclass(frozen=True)
class Rehearsal:
    """A filled rehearsal topic: where its new alerts start (a Spark ``startingOffsets`` JSON) and how many
    were copied from the input topic and made up from probes."""

    topic: str
    starting_offsets: str
    copied: int
    probes: int

    @property
    def alerts(self) -> int:
        return self.copied + self.probes


def rehearsal_topic(topic: str, name: str) -> str:
    """The rehearsal topic of stream ``name`` on input ``topic``."""
    return f"{topic}.rehearsal" + ("" if name == topic else f".{name}")


def fill_rehearsal(cfg: Config, topic: str, name: str, alerts: int, probes: list[bytes]) -> Rehearsal:
    """Write ``alerts`` messages to the stream's rehearsal topic (one partition per input partition): the input
    topic's latest, spread over its partitions, then ``probes`` (probe messages, cycled) for the rest."""
    target = rehearsal_topic(topic, name)
    partitions = max(1, topic_partitions(cfg, topic))
    ensure_topics(cfg, {target: partitions}, {"retention.ms": str(RETENTION_MS)})
    spread = topic_partitions(cfg, target)  # made before, when the input had other partitions: kept as it is
    consumer = Consumer(client_settings(cfg, **{"group.id": f"skyfilter-rehearsal-{uuid.uuid4()}",
                                                "enable.auto.commit": False, "log_level": 0}))
    producer = Producer(client_settings(cfg, **{"linger.ms": 5, "log_level": 0}))
    try:
        start = {p: watermarks(consumer, TopicPartition(target, p))[1] for p in range(spread)}
        copied = _copy_latest(consumer, producer, topic, target, partitions, spread, alerts)
        made_up = max(0, alerts - copied) if probes else 0
        for index in range(made_up):
            producer.produce(target, probes[index % len(probes)], partition=index % spread)
            producer.poll(0)
        left = producer.flush(30)
        if left:
            raise KafkaException(f"{left} rehearsal message(s) not written within 30 s")
    finally:
        consumer.close()
    offsets = json.dumps({target: {str(p): o for p, o in start.items()}})
    return Rehearsal(target, offsets, copied, made_up)


def _copy_latest(consumer: Consumer, producer: Producer, topic: str, target: str, partitions: int, spread: int,
                 alerts: int) -> int:
    """Copy up to ``alerts`` of the input's latest messages, partition to partition; how many were copied."""
    share = -(-alerts // partitions)
    assignment, wanted = [], 0
    for partition in range(partitions):
        low, high = watermarks(consumer, TopicPartition(topic, partition))
        first = max(low, high - share)
        if high > first:
            assignment.append(TopicPartition(topic, partition, first))
            wanted += high - first
    if not assignment:
        return 0
    consumer.assign(assignment)
    read, copied, idle = 0, 0, 0
    while read < wanted and idle < 20:  # 10 s without a message: what is left is gone (retention, compaction)
        batch = consumer.consume(500, POLL_S)
        idle = 0 if batch else idle + 1
        for message in batch:
            read += message.error() is None
            if message.error() is None and message.value() is not None:
                producer.produce(target, message.value(), key=message.key(),
                                 partition=message.partition() % spread, headers=message.headers())
                producer.poll(0)
                copied += 1
    return copied
