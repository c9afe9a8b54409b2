"""Optional nightly Kafka topics: every accepted alert also goes to ``<topic>.<night>``.

DMTN-028 recommends "a new topic each night, which would allow rewinding to
the beginning of the night".  These topics keep the night only for a short
retention (``stream.nightly_topics.retention_hours``); the Delta archive keeps
it for good, and ``replay_night.py --to-topic <topic>.<night>`` recreates one.
Messages keep their bytes, key and partition number.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.kafka.topics import ensure_topics, topic_partitions
from skyfilter.plan.outputs import register_writers
from skyfilter.registry.client import open_registry


def nightly_topic(topic: str, night: str) -> str:
    """The nightly topic of an input topic."""
    return f"{topic}.{night}"


class NightlyTopics:
    """Writes a batch's accepted messages to their night's topic, creating it on first use."""

    def __init__(self, cfg: Config, topic: str):
        self.cfg = cfg
        self.topic = topic
        self.retention_ms = str(int(cfg.stream.nightly_topics.retention_hours * 3_600_000))
        self.partitions = max(topic_partitions(cfg, topic), 1)
        self.ready: set[str] = set()
        self.registered: set[tuple[str, int]] = set()

    def write(self, accepted: DataFrame, kafka_options: dict[str, str], nights: list[str],
              writers: dict[int, str]) -> None:
        """Copy accepted messages (needs night, kafka_key/value/partition columns) of these nights to their
        nightly topics, whose subjects hold the input's writer schemas ``writers`` under their ids."""
        names = [nightly_topic(self.topic, n) for n in nights]
        new = [name for name in names if name not in self.ready]
        if new:
            ensure_topics(self.cfg, dict.fromkeys(new, self.partitions), {"retention.ms": self.retention_ms})
            self.ready.update(new)
        unregistered = {name: {i: t for i, t in writers.items() if (name, i) not in self.registered}
                        for name in names}
        if any(unregistered.values()):
            registry = open_registry(self.cfg, output=True)
            for name, pending in unregistered.items():
                register_writers(registry, name, pending)
                self.registered.update((name, i) for i in pending)
        accepted.select(F.concat(F.lit(self.topic + "."), "night").alias("topic"), F.col("kafka_key").alias("key"),
                        F.col("kafka_value").alias("value"), F.col("kafka_partition").alias("partition")) \
            .write.format("kafka").options(**kafka_options).mode("append").save()
