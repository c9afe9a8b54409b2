"""How each lane of a stream job is triggered, and Spark's forms of a trigger."""

from __future__ import annotations

import re
from dataclasses import dataclass

from skyfilter.core.errors import SkyfilterError

REALTIME = "realtime"  # the delivery trigger of Real-time Mode
AVAILABLE_NOW = "availableNow"  # what the topic holds now, then stop (tests, replays)


@dataclass(frozen=True)
class Triggers:
    """How each lane is triggered."""

    delivery: str             # "0s", "5s"..., "realtime", or "availableNow"
    archive: str              # "10s"..., or "availableNow"
    realtime_interval: str    # Real-time Mode's checkpoint interval
    archive_log: str = "30s"  # the archive lane's delivery-log query, or "availableNow"

    @property
    def available_now(self) -> bool:
        return self.delivery == AVAILABLE_NOW


def trigger_keywords(label: str) -> dict:
    """Keyword arguments of ``DataStreamWriter.trigger`` for a micro-batch trigger label."""
    if label == AVAILABLE_NOW:
        return {"availableNow": True}
    return {"processingTime": duration(label)}


def duration(text: str) -> str:
    """'0', '500ms', '5s', '1m' -> Spark's '500 milliseconds' form; anything else is a one-line error."""
    text = str(text).strip()
    if text in ("0", "0s", "asap"):
        return "0 seconds"
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|milliseconds?|seconds?|minutes?|hours?)?", text)
    if not match:
        raise SkyfilterError(f"'{text}' is not a duration like 500ms, 5s or 1m")
    unit = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours"}.get(match[2] or "s", match[2])
    return f"{match[1]} {unit if unit.endswith('s') else unit + 's'}"


def seconds(text: str) -> float:
    """A duration (any form :func:`duration` takes) in seconds."""
    number, unit = duration(text).split()
    return float(number) * {"milliseconds": 0.001, "seconds": 1, "minutes": 60, "hours": 3600}[unit]
