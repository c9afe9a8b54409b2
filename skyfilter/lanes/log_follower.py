"""The stream's delivery log, read in the driver as it is written.

Every alert a delivery lane sends to a broker comes with a ``match`` record on
the delivery log, written in the same Kafka write as the broker messages
(``skyfilter/lanes/delivery_log.py``); each dead letter with a ``dead_letter``
record, and a Real-time query's failing Python filters with ``filter_error``
records.  A Real-time query reports its
own figures only at its checkpoints, minutes apart, so what an operator must
see within seconds (latency per broker, matches, dead letters, failing
filters) is heard here instead: one consumer at the log's end, in a thread,
hands each record to the handlers registered for its kind, in every mode.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable

from skyfilter.core.config import Config
from skyfilter.kafka.clients import client_settings

logger = logging.getLogger(__name__)

Handler = Callable[[dict, int], None]  # (record, its Kafka timestamp in ms)


class DeliveryLogFollower:
    """A consumer at the end of the delivery log handing records to handlers."""

    def __init__(self, cfg: Config, topic: str):
        self.cfg = cfg
        self.topic = topic
        self.handlers: dict[str, list[Handler]] = {}
        self.stopping = threading.Event()
        self.ready = threading.Event()  # assigned at the topics' ends: records from now on are seen
        self.thread = threading.Thread(target=self._run, daemon=True, name="delivery-log-follower")

    def on(self, kind: str, handler: Handler) -> None:
        """Call ``handler(record, timestamp_ms)`` for each record of ``kind`` (``match``, ``dead_letter``,
        ``filter_error``) written from now on."""
        self.handlers.setdefault(kind, []).append(handler)

    def start(self, timeout_s: float = 30.0) -> DeliveryLogFollower:
        """Start reading at the log's end; returns once the consumer is there (or ``timeout_s`` passed)."""
        self.thread.start()
        self.ready.wait(timeout_s)
        return self

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer(client_settings(self.cfg, **{
            "group.id": f"skyfilter-log-follower-{uuid.uuid4()}", "enable.auto.commit": False, "log_level": 0,
            "fetch.wait.max.ms": 100}))
        try:
            metadata = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            partitions = sorted(metadata.partitions) if metadata is not None and metadata.error is None else [0]
            consumer.assign([TopicPartition(self.topic, p, OFFSET_END) for p in partitions])
            self.ready.set()
            while not self.stopping.is_set():
                for message in consumer.consume(500, 0.2):
                    if message.error() is None:
                        self._hand(message)
        except Exception as exc:  # noqa: BLE001 - the follower must never take the stream down
            logger.info(f"monitoring: the delivery log follower stopped ({exc}); latency and matches are then "
                        f"counted at checkpoints only")
        finally:
            self.ready.set()
            consumer.close()

    def _hand(self, message) -> None:
        if message.value() is None:
            return
        record = json.loads(message.value())
        for handler in self.handlers.get(record.get("kind"), ()):
            handler(record, message.timestamp()[1])

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
