"""The lanes of a stream job, named once: each is its own streaming query with its own checkpoint folder."""

from __future__ import annotations

from enum import StrEnum


class LaneName(StrEnum):
    """A lane of a stream job; its value names its checkpoint folder, status entry and metrics."""

    DELIVERY = "delivery"        # micro-batch delivery
    REALTIME = "realtime"        # delivery in Spark's Real-time Mode
    ARCHIVE = "archive"          # the input topic to the night's ``alerts`` table
    ARCHIVE_LOG = "archive-log"  # the delivery log to ``matches``, ``metrics`` and ``broker_visits``


# What ``filter_stream.py --lane`` runs (``delivery`` stands for micro-batches, Real-time Mode or both).
LANE_CHOICES: dict[str, frozenset[LaneName]] = {
    "both": frozenset({LaneName.DELIVERY, LaneName.ARCHIVE}),
    "delivery": frozenset({LaneName.DELIVERY}),
    "archive": frozenset({LaneName.ARCHIVE}),
}
