"""Kafka topics and clients: reachability checks and topic creation with explicit settings."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from skyfilter.config import Config
from skyfilter.errors import SkyfilterError


def admin_client(bootstrap: str) -> AdminClient:
    """An AdminClient that does not flood stderr while Kafka is unreachable."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def check_reachable(bootstrap: str, timeout: float = 10.0) -> None:
    """Raise a one-line SkyfilterError when no Kafka broker answers at ``bootstrap``."""
    try:
        admin_client(bootstrap).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise SkyfilterError(
            f"cannot reach Kafka at {bootstrap} ({exc.args[0].str() if exc.args else exc}): "
            f"is it running? (`skyfilter kafka start`)") from None


def topic_settings(cfg: Config, nodes: int | None = None) -> tuple[int, dict[str, str]]:
    """Replication factor and per-topic config every skyfilter topic gets."""
    replication = int(cfg.get("kafka.replication_factor"))
    if nodes is not None:
        replication = min(replication, nodes)
    settings = {
        "max.message.bytes": str(int(cfg.get("kafka.max_message_bytes"))),
        # Latency is measured broker-side: input append time -> output append time.
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": str(int(float(cfg.get("topics.retention_hours")) * 3600 * 1000)),
        "min.insync.replicas": str(min(int(cfg.get("kafka.min_insync_replicas")), replication)),
    }
    return replication, settings


def ensure_topics(cfg: Config, bootstrap: str, partitions_by_topic: dict[str, int],
                  extra_settings: dict[str, str] | None = None) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    Existing topics are left as they are (their partition count is not changed).
    """
    admin = admin_client(bootstrap)
    try:
        metadata = admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise SkyfilterError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    nodes = len(metadata.brokers)
    replication, settings = topic_settings(cfg, nodes)
    settings.update(extra_settings or {})
    missing = [NewTopic(name, num_partitions=int(parts), replication_factor=replication, config=settings)
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


def topic_partitions(bootstrap: str, topic: str) -> int:
    """Number of partitions of an existing topic (0 when it does not exist)."""
    metadata = admin_client(bootstrap).list_topics(topic=topic, timeout=10)
    info = metadata.topics.get(topic)
    return 0 if info is None or info.error is not None else len(info.partitions)
