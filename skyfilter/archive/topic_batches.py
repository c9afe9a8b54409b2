"""Batches of one Kafka topic for the archive's writers that run without Spark.

A writer reads its topic with a confluent-kafka consumer in batch windows (from
the first arrival, at most ``trigger_s`` long and ``max_messages`` big) and
stores each window with one commit per table that also records, as Delta app
transactions, the next offset of every partition it covers.  A writer that
starts again resumes from those offsets: the tables are its checkpoint, and no
consumer-group offset is ever committed.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from skyfilter.core.config import Config
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.read_back import watermarks
from skyfilter.lanes.monitoring import StreamMonitor

logger = logging.getLogger(__name__)

POLL_S = 0.5  # longest wait for messages inside a batch window
FULL_DISK_RETRY_S = 5.0
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
DISK_FULL_MESSAGE = re.compile(r"(No space left on device|File too large|Disk quota exceeded)( \(os error \d+\))?")


class TopicBatches(ABC):
    """Reads ``topic`` in batch windows and hands each to :meth:`write_batch` (a subclass stores it)."""

    def __init__(self, cfg: Config, topic: str, group: str, trigger_s: float, max_messages: int,
                 monitor: StreamMonitor | None = None, on_batch: Callable[[str], None] | None = None):
        from confluent_kafka import Consumer

        self.monitor = monitor  # the stream's metrics, when the writer runs in the stream job's own process
        self.on_batch = on_batch  # told each stored batch's line (a stream job counts its totals from them)
        self.topic = topic
        self.trigger_s = trigger_s
        self.max_messages = max_messages
        self.consumer = Consumer(client_settings(cfg, **{
            "group.id": group, "enable.auto.commit": False, "log_level": 0,
            "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024}))
        self.started: dict[int, int] = {}  # where each partition was read from (resume)
        self.marks: dict[int, tuple[int, int]] = {}  # each partition's low and high watermarks at the resume
        self.batches = 0
        self.writing = False  # a batch is being written (a stop waits for it)

    @abstractmethod
    def stored(self, partitions: list[int]) -> dict[int, int]:
        """The next offset of each partition the tables hold (partitions they hold nothing of left out)."""

    def first_offset(self, partition: int) -> int:
        """Where a partition the tables hold nothing of is read from (default: its beginning)."""
        from confluent_kafka import OFFSET_BEGINNING

        return OFFSET_BEGINNING

    def batch_done(self, line: str) -> None:
        """Say a stored batch's line, and tell :attr:`on_batch`."""
        logger.info(line)
        if self.on_batch is not None:
            self.on_batch(line)

    @abstractmethod
    def write_batch(self, messages: list) -> None:
        """Store one batch window's messages (and their next offsets) in the tables."""

    def resume(self) -> dict[int, int]:
        """Read each partition from what the tables hold, else from :meth:`first_offset`.

        The watermarks are asked for before the partitions are assigned: once the consumer fetches, each such
        request waits behind its long poll (0.5 s a partition, which a drain on stop paid in full).
        """
        from confluent_kafka import TopicPartition

        partitions = sorted(self.consumer.list_topics(self.topic, timeout=30).topics[self.topic].partitions)
        self.marks = {p: watermarks(self.consumer, TopicPartition(self.topic, p)) for p in partitions}
        stored = self.stored(partitions)
        self.started = {p: stored[p] if p in stored else self.first_offset(p) for p in partitions}
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in self.started.items()])
        return self.started

    def run(self, keep_going: Callable[[], bool], available_now: bool = False) -> int:
        """Store batches while ``keep_going()`` (``available_now``: until the topic's end as of the start); the
        number of batches."""
        ends = self._ends() if available_now else None
        while keep_going():
            messages = self._collect(keep_going)
            if messages:
                self.writing = True
                try:
                    self._store(messages, keep_going)
                finally:
                    self.writing = False
                self.batches += 1
            if ends is not None and self._reached(ends):
                break
        return self.batches

    def _store(self, messages: list, keep_going: Callable[[], bool]) -> None:
        """Write a batch; while the disk under the tables is full, say so once and try the same batch again
        every :data:`FULL_DISK_RETRY_S` (the writer falls behind, Kafka keeps the rest: nothing is dropped).  A
        stop while it is full ends the writer with the error; the next start resumes from the tables."""
        full_since = None
        while True:
            try:
                self.write_batch(messages)
                break
            except Exception as exc:  # noqa: BLE001 - delta-rs raises its own error type, naming the OS error
                reason = disk_full(exc)
                if reason is None or not keep_going():
                    raise
                if full_since is None:
                    full_since = time.monotonic()
                    logger.warning(f"archive: the disk under the tables is full ({reason}) writing {len(messages)} "
                                   f"message(s) of '{self.topic}': the archive falls behind, retrying every "
                                   f"{FULL_DISK_RETRY_S:g} s; nothing is dropped")
                time.sleep(FULL_DISK_RETRY_S)
        if full_since is not None:
            logger.info(f"archive: writing '{self.topic}' again after {time.monotonic() - full_since:.0f} s of a full "
                        f"disk; catching up")

    def _collect(self, keep_going: Callable[[], bool]) -> list:
        """Messages of one batch window: from the first arrival, ``trigger_s`` or ``max_messages``, whichever first."""
        messages: list = []
        deadline = None
        while len(messages) < self.max_messages and keep_going():
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            got = self.consumer.consume(self.max_messages - len(messages), wait)
            messages += [m for m in got if m.error() is None]
            if messages and deadline is None:
                deadline = time.monotonic() + self.trigger_s
            if deadline is not None and time.monotonic() >= deadline or (not got and deadline is None):
                break
        return messages

    def _ends(self) -> dict[int, int]:
        """The end offset, at the resume, of each partition that holds something past where it is read from.

        A partition with nothing to read (empty, or read to its end already) is left
        out: the consumer's position there stays logical (``OFFSET_BEGINNING``), and a
        drain waiting for it to reach the end would never end.
        """
        return {partition: high for partition, (low, high) in self.marks.items()
                if high > max(low, self.started.get(partition, -1))}

    def _reached(self, ends: dict[int, int]) -> bool:
        positions = {tp.partition: tp.offset for tp in self.consumer.position(self.consumer.assignment())}
        return all(max(positions.get(p, -1), self.started.get(p, -1)) >= end for p, end in ends.items())

    def close(self) -> None:
        """Let go of Kafka (the offsets live in the tables: nothing to commit)."""
        self.consumer.close()


def disk_full(error: BaseException) -> str | None:
    """The operating system's reason when ``error`` says the disk (or the writer's file size or quota) is full,
    else None."""
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
        return os.strerror(error.errno)
    found = DISK_FULL_MESSAGE.search(str(error))
    return found.group(0) if found else None


def next_offsets(messages: list) -> dict[int, int]:
    """The offset after the last message of each partition in a batch."""
    offsets: dict[int, int] = {}
    for m in messages:
        offsets[m.partition()] = max(offsets.get(m.partition(), 0), m.offset() + 1)
    return offsets
