"""Where a stream that has no checkpoint yet starts reading its input topic.

A stream started under a new ``--name`` on a topic that already holds alerts
would otherwise read them all again and re-deliver them to the broker topics.
``stream.starting_offsets`` (``--starting-offsets``):

* ``auto`` (default): what is appended to the topic from the moment the job
  was launched (``spark-submit``'s start: Kafka's offsets for that time), so a
  producer started together with the stream loses nothing while Spark starts;
  the earliest offsets for ``--available-now`` (what it is for) and for a
  topic that is empty or does not exist yet;
* ``latest``: from the topic's end when the job chooses (after Spark started);
* ``earliest``: everything the topic holds;
* a Spark offsets JSON (what a job passes to its archive process).

A stream that has a checkpoint always resumes from it, whatever this says.
The offsets JSON names the input topic only; a query over the stream's own
topics (the archive's query over the delivery log) reads them from their start
(:func:`for_topics`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.lag import LatestOffsets

logger = logging.getLogger(__name__)

CHOICES = ("auto", "latest", "earliest")


def starting_offsets(cfg: Config, topic: str, checkpoint: Path, available_now: bool,
                     launched_at: float | None = None) -> str:
    """The Spark ``startingOffsets`` of a stream whose checkpoint folder is ``checkpoint``, decided now;
    ``launched_at``: when the job was launched (``auto`` reads what was appended since; default now)."""
    choice = str(cfg.stream.starting_offsets).strip()
    if choice.startswith("{"):
        return choice
    if choice not in CHOICES:
        raise SkyfilterError(f"stream.starting_offsets is '{choice}': use {', '.join(CHOICES)} or a Spark offsets "
                             f"JSON")
    if choice == "earliest" or (choice == "auto" and available_now) or _has_checkpoint(checkpoint):
        return "earliest"
    latest = LatestOffsets(cfg)
    try:
        ends = latest(topic)
        if not sum(ends.values()):
            return "earliest"
        starts = latest.at(topic, int(1000 * (launched_at or time.time()))) if choice == "auto" else ends
    finally:
        latest.close()
    before, since = sum(starts.values()), sum(ends.values()) - sum(starts.values())
    logger.info(f"starting offsets: topic '{topic}' holds {before:,} message(s) from before this stream was launched; "
                f"they are not read (--starting-offsets earliest reads them)"
        + (f"; the {since:,} appended since are" if since else ""))
    return json.dumps({topic: {str(p): offset for p, offset in sorted(starts.items())}})


def _has_checkpoint(checkpoint: Path) -> bool:
    return any(checkpoint.glob("*/offsets/[0-9]*")) or any(checkpoint.glob("*/sources"))


def for_topics(starting: str, topics: list[str]) -> str:
    """The ``startingOffsets`` of a query subscribed to ``topics``, from the stream's ``starting``.

    Spark wants an offsets JSON to name every partition of every topic a query
    reads.  The stream's JSON names its input topic; a query over other topics
    (the stream's delivery log, written by this stream alone) starts at their
    beginning.
    """
    if not starting.startswith("{"):
        return starting
    given = json.loads(starting)
    named = {topic: given[topic] for topic in topics if topic in given}
    return json.dumps(named) if named else "earliest"
