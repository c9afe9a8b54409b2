"""Kafka topics and clients: reachability checks and topic creation with explicit settings."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings


def admin_client(cfg: Config) -> AdminClient:
    """An AdminClient that does not flood stderr while Kafka is unreachable."""
    return AdminClient(client_settings(cfg, log_level=0))


def check_reachable(cfg: Config, timeout: float = 10.0) -> None:
    """Raise a one-line SkyfilterError when no Kafka broker answers at the configured bootstrap servers."""
    try:
        admin_client(cfg).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise SkyfilterError(
            f"cannot reach Kafka at {cfg.bootstrap_servers} ({exc.args[0].str() if exc.args else exc}): "
            f"is it running? (`skyfilter kafka start`)") from None


def replication(cfg: Config, nodes: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a cluster of ``nodes`` brokers.

    ``auto`` (the default) is the durability profile of Kafka's docs on three or
    more nodes (replication 3, min.insync.replicas 2) and what one or two nodes
    allow below that.
    """
    factor = cfg.kafka.replication_factor
    factor = min(3, nodes) if factor in (None, "auto") else min(int(factor), nodes)
    insync = cfg.kafka.min_insync_replicas
    insync = max(1, factor - 1) if insync in (None, "auto") else min(int(insync), factor)
    return max(1, factor), insync


def topic_settings(cfg: Config, live_nodes: int) -> tuple[int, dict[str, str]]:
    """Replication factor and per-topic config every skyfilter topic gets.

    With ``auto`` replication the cluster's own defaults apply (factor -1), so a
    topic created while one node is down still gets the cluster's full factor.
    """
    settings = {
        "max.message.bytes": str(cfg.kafka.max_message_bytes),
        # Latency is measured broker-side: input append time -> output append time.
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": str(int(cfg.topics.retention_hours * 3600 * 1000)),
    }
    if cfg.kafka.replication_factor in (None, "auto") and cfg.kafka.min_insync_replicas in (None, "auto"):
        return -1, settings
    factor, insync = replication(cfg, live_nodes)
    return factor, {**settings, "min.insync.replicas": str(insync)}


def ensure_topics(cfg: Config, partitions_by_topic: dict[str, int],
                  extra_settings: dict[str, str] | None = None) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    Existing topics are left as they are (their partition count is not changed).
    """
    admin = admin_client(cfg)
    try:
        metadata = admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise SkyfilterError(f"cannot reach Kafka at {cfg.bootstrap_servers}: {exc}") from None
    nodes = len(metadata.brokers)
    factor, settings = topic_settings(cfg, nodes)
    settings.update(extra_settings or {})
    missing = [NewTopic(name, num_partitions=int(parts), replication_factor=factor, config=settings)
               for name, parts in partitions_by_topic.items() if name not in metadata.topics]
    created = []
    for name, future in (admin.create_topics(missing, operation_timeout=30).items() if missing else []):
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise SkyfilterError(f"cannot create Kafka topic '{name}': {exc.args[0].str()}") from None
    _wait_for_leaders(admin, created)
    return created


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout: float = 30.0) -> None:
    """Block until new topics have a leader for every partition (creation is asynchronous)."""
    deadline = time.monotonic() + timeout
    for topic in topics:
        while True:
            info = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
            if info is not None and info.error is None and info.partitions and \
                    all(p.leader >= 0 for p in info.partitions.values()):
                break
            if time.monotonic() > deadline:
                raise SkyfilterError(f"Kafka topic '{topic}' was created but has no leader after {timeout:.0f} s")
            time.sleep(0.1)


def topic_partitions(cfg: Config, topic: str) -> int:
    """Number of partitions of an existing topic (0 when it does not exist)."""
    metadata = admin_client(cfg).list_topics(topic=topic, timeout=10)
    info = metadata.topics.get(topic)
    return 0 if info is None or info.error is not None else len(info.partitions)
