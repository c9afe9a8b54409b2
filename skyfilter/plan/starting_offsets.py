"""Where a stream that has no checkpoint yet starts reading its input topic.

A stream started under a new ``--name`` on a topic that already holds alerts
would otherwise read them all again and re-deliver them to the broker topics.
``stream.starting_offsets`` (``--starting-offsets``):

* ``auto`` (default): from the topic's end as it was when the job was started,
  or the earliest offsets for ``--available-now`` (what it is for) and for a
  topic that is empty or does not exist yet;
* ``latest``: from the topic's end when the job was started;
* ``earliest``: everything the topic holds;
* a Spark offsets JSON (what a job passes to its archive process).

A stream that has a checkpoint always resumes from it, whatever this says.
"""

from __future__ import annotations

import json
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lag import LatestOffsets

CHOICES = ("auto", "latest", "earliest")


def starting_offsets(cfg: Config, topic: str, checkpoint: Path, available_now: bool, log=print) -> str:
    """The Spark ``startingOffsets`` of a stream whose checkpoint folder is ``checkpoint``, decided now."""
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
    finally:
        latest.close()
    held = sum(ends.values())
    if not held:
        return "earliest"
    log(f"starting offsets: topic '{topic}' holds {held:,} message(s) from before this stream's first start; "
        f"they are not read (--starting-offsets earliest reads them)")
    return json.dumps({topic: {str(p): offset for p, offset in sorted(ends.items())}})


def _has_checkpoint(checkpoint: Path) -> bool:
    return any(checkpoint.glob("*/offsets/[0-9]*")) or any(checkpoint.glob("*/sources"))
