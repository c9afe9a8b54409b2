"""`skyfilter status`: one screen for operators without Grafana.

Everything comes from files and Kafka, never from Spark, so it answers in a
second whether the job runs or not: each stream's status file (written by
the running job after every batch), its checkpoint (the last committed
batch and its offsets), Kafka's latest offsets (the lag), the filter states,
and the local Kafka nodes and Spark standalone daemons.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LaneName
from skyfilter.kafka.lag import LatestOffsets, checkpoint_topic, committed_offsets, lag_per_partition
from skyfilter.local.processes import is_running, write_whole


def _alive(pid: int | None) -> bool:
    return is_running(pid)


def _ago(moment: float | None) -> str:
    if not moment:
        return "-"
    seconds = max(0, time.time() - float(moment))
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _num(value, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


ARCHIVE_PART = "archive"  # an archive-only job (``--lane archive``) writes its own status file beside the stream's


def status_file(cfg: Config, name: str, archive_only: bool = False) -> Path:
    """The status file a running stream job keeps (an archive-only job has its own, merged on display)."""
    return cfg.run_dir / (f"filter_stream.{name}.{ARCHIVE_PART}.json" if archive_only else f"filter_stream.{name}.json")


STARTING = "waiting for a producer"  # the status of a job that has chosen its starting offsets, before it runs
BUILDING = "starting the lanes"


def write_starting(cfg: Config, name: str, topic: str, state: str, archive_only: bool = False,
                   **details: object) -> Path:
    """Write a starting job's status file: it has chosen where it starts reading, so what is produced from now
    on is read (``skyfilter status --wait`` returns); the job replaces it once it runs.  ``details``: further
    fields (a job that keeps no live status, such as the archive without a JVM, writes its ``running`` one so)."""
    path = status_file(cfg, name, archive_only)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps({"pid": os.getpid(), "topic": topic, "started_at": time.time(), "status": state,
                                  **details}))
    return path


def wait_until_running(cfg: Config, name: str, timeout_s: float, poll_s: float = 0.5) -> None:
    """Block until stream ``name``'s job runs (its lanes started: it says ``running:``).  A job that does not
    get there within ``timeout_s`` is one error line, saying where it stopped."""
    path = status_file(cfg, name)
    deadline = time.monotonic() + timeout_s
    while True:
        info = _read_status(path)
        alive = _alive(info.get("pid"))
        if alive and info.get("status") == "running":
            return
        if time.monotonic() >= deadline:
            where = f"it is still {info['status']} (pid {info['pid']})" if alive else \
                f"{path} names pid {info['pid']}, which is not running" if info.get("pid") else \
                "no job of that name has started (is `spark-submit pipelines/filter_stream.py` running?)"
            errors = cfg.run_dir / f"filter_stream.{name}.error.log"
            raise SkyfilterError(f"stream '{name}' was not running within {timeout_s:.0f} s under {cfg.state_dir}: "
                                 f"{where}; its output{f' and {errors} say' if errors.exists() else ' says'} why")
        time.sleep(poll_s)


def stream_names(cfg: Config) -> list[str]:
    """Every stream with a status file or a checkpoint under the state dir."""
    names = {p.name[len("filter_stream."):-len(".json")].removesuffix(f".{ARCHIVE_PART}")
             for p in cfg.run_dir.glob("filter_stream.*.json")}
    names |= {p.parent.parent.name for p in cfg.checkpoint_dir.glob("*/*/offsets")}
    return sorted(names)


LANES = (LaneName.REALTIME, LaneName.DELIVERY, LaneName.ARCHIVE, LaneName.ARCHIVE_LOG)  # as the screen shows them


def stream_lines(cfg: Config, name: str, latest) -> list[str]:
    """The status of one stream: state, then per lane its last batch, rates and lag; totals, filters.

    ``latest`` gives Kafka's latest offsets of a topic (None: do not show the lag).
    """
    info, archive = (_read_status(status_file(cfg, name, part)) for part in (False, True))
    if not info and _alive(archive.get("pid")):
        info = archive  # an archive-only job runs alone
    running = _alive(info.get("pid"))
    folder = Path(info.get("checkpoint") or cfg.checkpoint_dir / name)
    lanes = info.get("lanes", {}) if running else {}
    if archive is not info and _alive(archive.get("pid")):  # its own process: its lanes are its to show (the lag
        lanes = {**lanes, **{lane: {**lanes.get(lane, {}), **own}  # the parent measured stays where it has none)
                             for lane, own in archive.get("lanes", {}).items()}}
    checkpoints = {lane: folder / lane for lane in LANES if (folder / lane / "offsets").exists() or lane in lanes}
    topic = info.get("topic") or next((checkpoint_topic(c) for lane, c in checkpoints.items()
                                       if lane != LaneName.ARCHIVE_LOG and checkpoint_topic(c)), None)
    if running and info.get("status", "running") != "running":
        head = (f"stream '{name}': STARTING (pid {info['pid']}): {info['status']}, topic '{topic}'; alerts produced "
                f"from now on are read")
    elif running:
        up = time.time() - float(info["started_at"])
        head = (f"stream '{name}': RUNNING (pid {info['pid']}, up {up / 60:.0f} min) on {info.get('master')}, "
                f"topic '{topic}'")
    else:
        head = f"stream '{name}': STOPPED" + (" (stale status file: the job died)" if info else "") + \
               (f", topic '{topic}'" if topic else "")
    lines = [head]
    if running and info.get("metrics_url"):
        lines.append(f"  metrics   {info['metrics_url']}")
    for lane, checkpoint in checkpoints.items():
        lines += _lane_lines(lane, lanes.get(lane), checkpoint, topic, latest, running)
    if running and "latency_last_minute" in info:
        lines.append(_latency_line(info["latency_last_minute"]))
    totals = info.get("totals") if running else None
    if totals:
        brokers = ", ".join(f"{b} {n:,}" for b, n in sorted(totals["by_broker"].items()))
        lines.append(f"  this run  {totals['input_alerts']:,} alerts in, {totals['archived']:,} archived, "
                     f"{totals['matches']:,} delivered ({brokers}), {totals['dead_letters']:,} dead letter(s)")
    lines.append("  filters   " + _filter_summary(cfg.filter_states_file(name)))
    return lines


def _read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _lane_lines(lane: str, info: dict | None, checkpoint: Path, topic: str | None, latest, running: bool
                ) -> list[str]:
    """One lane: trigger and last batch (while the job runs), and its Kafka lag (as the job measured it while it
    runs, else from its checkpoint)."""
    trigger = f", trigger {info['trigger']}" if info else ""
    batch = (info or {}).get("last_batch") or {}
    if lane == LaneName.ARCHIVE_LOG:
        topic = (info or {}).get("topic") or checkpoint_topic(checkpoint)
    if batch.get("batch_id") is not None:
        what = {"archive": f"{batch['alerts']:,} alerts archived",
                LaneName.ARCHIVE_LOG: f"{batch['alerts']:,} delivery records logged"}.get(
            lane, f"{batch['alerts']:,} alerts, {batch.get('matches', 0):,} matches")
        lines = [f"  {lane:<9} last batch {batch['batch_id']} ({_ago(batch['finished_at'])}{trigger}): {what}, "
                 f"done in {_num(batch['processing_s'], ' s')}, latency p50 {_num(batch.get('latency_p50_s'), ' s')} "
                 f"p99 {_num(batch.get('latency_p99_s'), ' s')}",
                 f"  {'':<9} rates input {_num(batch['input_rows_per_second'], ' alerts/s')}, processed "
                 f"{_num(batch['processed_rows_per_second'], ' alerts/s')}"]
    else:
        lines = [f"  {lane:<9} " + ("no batch with alerts yet in this run" + trigger if running else "stopped")]
    unit = "records" if lane == LaneName.ARCHIVE_LOG else "alerts"
    measured = (info or {}).get("lag") if running and (info or {}).get("lag_at") else None
    if measured is not None:  # the job's own measure: where its tasks have read to, or what its tables hold
        parts = ", ".join(f"p{p} {n:,}" for p, n in measured.items())
        behind = max((info.get("lag_seconds") or {}).values(), default=None)
        oldest = "" if behind is None else f"; oldest unread {_num(behind, ' s')} old"
        lines.append(f"  {'':<9} Kafka lag {sum(measured.values()):,} {unit} ({parts}), measured by the job "
                     f"{_ago(info['lag_at'])}{oldest}")
    elif latest is not None and topic:
        committed_batch, committed = committed_offsets(checkpoint, topic)
        try:
            lag = lag_per_partition(latest(topic), committed)
            parts = ", ".join(f"p{p} {n:,}" for p, n in lag.items())
            lines.append(f"  {'':<9} Kafka lag {sum(lag.values()):,} {unit} ({parts}); last committed batch "
                         f"{'-' if committed_batch is None else committed_batch}")
            if lane == LaneName.REALTIME:
                lines.append(f"  {'':<9} (counted from the last checkpoint: Real-time Mode commits once per "
                             f"checkpoint interval and delivers what arrived since as it comes)")
        except SkyfilterError as exc:
            lines.append(f"  {'':<9} Kafka lag unknown: {exc}")
    return lines


def _latency_line(recent: dict[str, dict]) -> str:
    """Delivery latency per broker over the last minute, as the job heard it from its delivery log."""
    if not recent:
        return "  latency   no alert delivered in the last minute"
    return "  latency   last minute, input to broker topic: " + "; ".join(
        f"{broker} p50 {_num(f['p50_s'], ' s', 3)} p99 {_num(f['p99_s'], ' s', 3)} ({f['deliveries']:,})"
        for broker, f in recent.items())


def filter_state_counts(states: list[dict]) -> str:
    """'3 enabled, 1 quarantined, 0 broken, 1 unused' for a stream's filter states."""
    counts = {k: sum(s["state"] == k for s in states) for k in ("enabled", "quarantined", "broken", "unused")}
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def _filter_summary(path: Path) -> str:
    if not path.exists():
        return "no filter states recorded yet"
    states = json.loads(path.read_text())["filters"]
    quarantined = [s["name"] for s in states if s["state"] == "quarantined"]
    return filter_state_counts(states) + (f": quarantined {', '.join(quarantined)}" if quarantined else "")


def status_screen(cfg: Config, only: str | None = None) -> list[str]:
    """Every stream's status, then the local Kafka nodes and the Spark standalone cluster."""
    from skyfilter.local.kafka import LocalKafka
    from skyfilter.local.spark_cluster import SparkStandalone

    names = [only] if only else stream_names(cfg)
    lines = [f"skyfilter status ({cfg.state_dir}, Kafka {cfg.bootstrap_servers})"]
    latest = None
    try:
        latest = LatestOffsets(cfg) if names else None
    except Exception as exc:  # noqa: BLE001 - a broken Kafka config must not hide the rest of the screen
        lines.append(f"Kafka client could not be created: {exc}")
    failure: list[SkyfilterError] = []

    def lookup(topic: str) -> dict[int, int]:
        """Kafka's latest offsets; after one failure the others fail at once (no timeout per stream)."""
        if failure:
            raise failure[0]
        try:
            return latest(topic)
        except SkyfilterError as exc:
            failure.append(exc)
            raise

    try:
        for name in names:
            lines += stream_lines(cfg, name, lookup if latest is not None else None)
    finally:
        if latest is not None:
            latest.close()
    if not names:
        lines.append("no streams under this state dir (start one: spark-submit pipelines/filter_stream.py)")
    nodes = LocalKafka(cfg).status()
    running = [n for n in nodes if n["pid"]]
    lines.append(f"Kafka (local): {len(running)} of {len(nodes)} node(s) running" if nodes
                 else "Kafka (local): none started here (an external cluster is checked through the lag above)")
    lines.append(SparkStandalone(cfg).summary())
    return lines

