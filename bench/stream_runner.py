"""The stream job run by a benchmark: ``pipelines/filter_stream.py`` in a thread of the benchmark's process.

The benchmark's process is then the Spark driver (local mode: the executor
too), so its memory is the stream's memory.  A benchmark registers the topic's
schema first, starts the stream (both lanes), waits until it runs (warm),
produces, waits until the archive lane has taken in every alert (so delivery,
which never waits for the archive, is done too), then stops it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.lanes.totals import ARCHIVE_LINE, LOG_LINE

DELIVERY_LINE = re.compile(r"^(?:realtime )?batch (\d+): (\d+) alerts, (\d+) matches")


@dataclass
class StreamRun:
    """A stream job running in a thread, and what it has said so far."""

    name: str
    delivery_reports: bool = False  # its delivery lane prints a line per batch (micro-batches, not Real-time Mode)
    thread: threading.Thread | None = None
    lines: list[str] = field(default_factory=list)
    error: BaseException | None = None
    finished: bool = False

    def alerts_in(self, lane: str = "archive") -> int:
        """Alerts a lane has taken in so far (from its batch lines): ``delivery`` (and realtime) or ``archive``."""
        if lane == "archive":
            return sum(int(m[2]) + int(m[3]) for m in map(ARCHIVE_LINE.match, list(self.lines)) if m)
        return sum(int(m[2]) for m in map(DELIVERY_LINE.match, list(self.lines)) if m)

    def wait_for_alerts(self, expected: int, timeout_s: float, on_progress=None, lane: str = "archive") -> None:
        """Block until a lane has taken in ``expected`` alerts; raise if the stream fails or it times out.

        The archive lane is the default: it reads every alert, and a Real-time
        delivery query reports only once per checkpoint interval.  Micro-batch
        delivery must have reported them too: an archive lane in the driver may
        take them in first, and the matches it logs are those reported.
        """
        deadline = time.monotonic() + timeout_s
        seen = 0
        while (current := self.alerts_in(lane)) < expected or (lane == "archive" and not self._delivered_and_logged(
                expected)):
            if on_progress and current > seen:
                on_progress(current - seen)
                seen = current
            self._check_running()
            if time.monotonic() > deadline:
                raise SkyfilterError(f"stream '{self.name}' took in {current} of {expected} alerts "
                                     f"within {timeout_s:.0f} s")
            time.sleep(0.2)
        if on_progress and self.alerts_in(lane) > seen:
            on_progress(self.alerts_in(lane) - seen)

    def _delivered_and_logged(self, expected: int) -> bool:
        """Whether micro-batch delivery reported ``expected`` alerts and the archive logged every match the
        delivery lanes reported (it reads the delivery log after the alerts themselves may be archived)."""
        if self.delivery_reports and self.alerts_in("delivery") < expected:
            return False
        lines = list(self.lines)
        delivered = sum(int(m[3]) for m in map(DELIVERY_LINE.match, lines) if m)
        return sum(int(m[2]) for m in map(LOG_LINE.match, lines) if m) >= delivered

    def stop(self, spark, timeout_s: float = 120) -> None:
        """Stop the stream's queries, each micro-batch query between two batches as the job's own stop does (a
        Real-time query always runs one), and wait for its thread."""
        from skyfilter.core.lane_names import LaneName
        from skyfilter.lanes.lane import between_batches

        deadline = time.monotonic() + 30
        for query in spark.streams.active:
            if query.name and query.name.startswith("skyfilter_") and query.name.endswith(f"_{self.name}"):
                if not query.name.startswith(f"skyfilter_{LaneName.REALTIME}_"):
                    between_batches(query, deadline)
                query.stop()
        if self.thread is not None:
            self.thread.join(timeout_s)
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise SkyfilterError(f"stream '{self.name}' failed: {self.error}")

    def _check_running(self) -> None:
        self._check()
        if self.finished:
            raise SkyfilterError(f"stream '{self.name}' ended early; its last lines: {self.lines[-3:]}")


def start_stream(cfg: Config, spark, topic: str, name: str, filters_dir: Path, brokers_file: Path,
                 trigger: str = "0", max_offsets: int | None = None, sets: list[str] | None = None,
                 start_timeout_s: float = 300, archive_trigger: str | None = None, lane: str = "both",
                 log_trigger: str | None = None) -> StreamRun:
    """Start the stream job on ``topic`` (schema already registered) and return once it runs; ``lane``: both
    lanes, or one (``--lane``); ``archive_trigger`` and ``log_trigger``: those of the archive's two queries."""
    from skyfilter.core.log import captured
    from skyfilter.jobs.filter_stream import parse_args, run

    argv = ["--topic", topic, "--name", name, "--filters-dir", str(filters_dir), "--brokers", str(brokers_file),
            "--trigger", trigger, "--wait-for-schema", "0", "--bootstrap", cfg.bootstrap_servers,
            "--state-dir", str(cfg.get("state_dir")), "--lane", lane] + (
                ["--archive-trigger", archive_trigger] if archive_trigger else [])
    for setting in ([f"stream.max_offsets_per_trigger={max_offsets}"] if max_offsets else []) + (
            [f"archive.log_trigger={log_trigger}"] if log_trigger else []) + (sets or []):
        argv += ["--set", setting]
    stream = StreamRun(name, delivery_reports=trigger != "realtime" and lane != "archive")

    def body() -> None:
        try:
            with captured() as lines:  # what the stream says, read by the waiting side
                stream.lines = lines
                run(parse_args(argv), spark)
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting side
            stream.error = exc
        stream.finished = True

    stream.thread = threading.Thread(target=body, name=f"stream-{name}", daemon=True)
    stream.thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not any(line.startswith(f"stream '{name}' running") for line in list(stream.lines)):
        if stream.finished:
            stream._check_running()
        if time.monotonic() > deadline:
            raise SkyfilterError(f"stream '{name}' did not start within {start_timeout_s:.0f} s")
        time.sleep(0.2)
    return stream


def register_topic(cfg: Config, topic: str, schema: dict, partitions: int | None = None,
                   settings: dict[str, str] | None = None) -> int:
    """Create ``topic`` (with extra topic ``settings``) and register its schema before the stream starts;
    returns the schema id."""
    from skyfilter.kafka.clients import act_as
    from skyfilter.kafka.topics import ensure_topics
    from skyfilter.registry.client import open_registry, subject_for

    producer_cfg = act_as(cfg, "producer")
    ensure_topics(producer_cfg, {topic: partitions or cfg.topics.alerts_partitions}, settings)
    return open_registry(producer_cfg).register(subject_for(topic), schema, same_alerts=True)
