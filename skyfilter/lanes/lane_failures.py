"""What a lane's failed query means: one line for the user, and whether it is one the lane can resume from."""

from __future__ import annotations

import re
from pathlib import Path

from skyfilter.core.errors import SkyfilterError


def failure_line(stream: str, lane: str, exc: BaseException, log_path: Path) -> SkyfilterError:
    """One line for the user (the last Python or Java error of the trace); the whole error goes to ``log_path``."""
    text = str(exc)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(text)
    errors = [line.strip() for line in text.splitlines() if re.match(r"^\s*[A-Za-z_.]+(Error|Exception):", line)]
    reason = errors[-1] if errors else (text.strip().splitlines() or ["unknown error"])[0]
    return SkyfilterError(f"stream '{stream}' failed in its {lane} lane: {reason[:300]} (full error in {log_path})")


def is_spark_55271(exc: BaseException) -> bool:
    """Whether a query failed on Spark's NullPointerException in the Kafka source's progress metrics (4.1.1 on)."""
    text = str(exc)
    return "IterableOps.map" in text and "Option.get()" in text and "is null" in text
