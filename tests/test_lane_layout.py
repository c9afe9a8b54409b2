"""Unit tests of how a stream job lays out its lanes: task slots per lane, the archive in a process of its
own, and the status of a stream whose archive runs apart."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest

from conftest import ROOT, saying
from skyfilter.archive.process import ArchiveProcess
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LANE_CHOICES
from skyfilter.jobs.filter_stream import archive_arguments, load_config, parse_args
from skyfilter.lanes.totals import StreamTotals
from skyfilter.local.status import status_file, stream_lines, stream_names
from skyfilter.plan.run_plan import archive_apart, settle_run
from skyfilter.plan.slots import Slots, check_realtime_slots, delivery_tasks, local_cores, plan_slots

BOTH = LANE_CHOICES["both"]


@pytest.fixture()
def cfg(tmp_path) -> Config:
    cfg = Config.load(ROOT / "conf" / "local.yaml")
    cfg = cfg.with_values({"state_dir": str(tmp_path)})
    return cfg


def test_local_cores_of_masters():
    assert local_cores("local") == 1 and local_cores("local[4]") == 4 and local_cores("local[3,2]") == 3
    assert local_cores("local[*]") == os.cpu_count()
    assert local_cores("spark://127.0.0.1:7077") is None


def test_delivery_keeps_its_cores_and_the_other_lanes_get_slots_of_their_own(cfg):
    both = plan_slots(cfg, cores=2, realtime_partitions=0, micro_batches=True, archive=True)
    assert both == Slots(delivery=2, realtime=0, archive=1, archive_log=1) and both.total == 4
    assert delivery_tasks(cfg, 4, both) == 2, "local[2] raised to local[4]: delivery keeps both cores"
    assert delivery_tasks(cfg, 2, both) == 1, "a cluster of 2 slots: delivery gets what the archive leaves"
    realtime = plan_slots(cfg, cores=2, realtime_partitions=8, micro_batches=False, archive=False)
    assert realtime == Slots(0, 8, 0, 0)
    cfg = cfg.with_values({"stream.tasks": 1})
    assert plan_slots(cfg, 2, 0, True, False).delivery == 1


def test_too_few_slots_for_real_time_mode_is_one_line_naming_the_need():
    with pytest.raises(SkyfilterError, match=r"topic 'a' has 8, so this stream needs 11 task slots and Spark has 4"):
        check_realtime_slots(4, Slots(delivery=2, realtime=8, archive=1, archive_log=1), "a")
    check_realtime_slots(11, Slots(delivery=2, realtime=8, archive=1, archive_log=1), "a")


def test_the_archive_runs_apart_only_for_a_long_running_job_of_both_lanes(cfg):
    assert archive_apart(cfg, BOTH, available_now=False, local_master=True)
    assert not archive_apart(cfg, BOTH, available_now=False, local_master=False), "auto: one JVM on a cluster"
    assert not archive_apart(cfg, BOTH, available_now=True, local_master=True), "available-now drains in order"
    assert not archive_apart(cfg, LANE_CHOICES["delivery"], available_now=False, local_master=True)
    cfg = cfg.with_values({"archive.process": "same"})
    assert not archive_apart(cfg, BOTH, available_now=False, local_master=True)
    cfg = cfg.with_values({"archive.process": "separate"})
    assert archive_apart(cfg, BOTH, available_now=False, local_master=False)
    cfg = cfg.with_values({"archive.process": "apart"})
    with pytest.raises(SkyfilterError, match="archive.process is 'apart': use auto, same or separate"):
        archive_apart(cfg, BOTH, available_now=False, local_master=True)


def test_the_archive_process_gets_the_config_this_run_settled_and_its_own_endpoint(cfg, tmp_path):
    args = parse_args(["--topic", "t", "--trigger", "0", "--stop-when-idle", "30", "--set", "stream.tasks=1",
                       "--state-dir", str(tmp_path)])
    settled = load_config(args).with_values({"stream.starting_offsets": '{"t":{"0":5}}'})
    run = dataclasses.replace(settle_run(settled, "night1", "both", False, "local[2]")[0], topic="t")
    child = parse_args(archive_arguments(settled, run))
    assert (child.lane, child.name, child.stop_when_idle, child.set) == ("archive", "night1", None, []), \
        "the parent stops it once delivery has stopped; nothing is parsed again from flags"
    received = load_config(child)
    assert received.data == settled.with_values({
        "monitoring.port": settled.monitoring.archive_port, "archive.process": "same",
        "archive.writer": run.archive_writer}).data, "the settled config, the writer this run settled"
    assert (received.topics.alerts, received.stream.tasks, received.state_dir) == ("t", 1, tmp_path)
    assert received.stream.starting_offsets == '{"t":{"0":5}}', "where the parent settled the stream to start"
    quiet = settled.with_values({"monitoring.port": None})
    assert load_config(parse_args(archive_arguments(quiet, run))).monitoring.port is None, "off with the stream's"


def test_status_shows_the_archive_lanes_of_a_process_of_their_own(cfg):
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    batch = {"batch_id": 4, "finished_at": 0, "alerts": 1000, "processing_s": 2.5, "input_rows_per_second": None,
             "processed_rows_per_second": 400.0}
    status_file(cfg, "s").write_text(json.dumps({
        "pid": os.getpid(), "topic": "t", "started_at": 0, "master": "local[2]",
        "lanes": {"delivery": {"trigger": "0s", "last_batch": {}},
                  "archive": {"trigger": "10s (process 1)", "last_batch": {}, "lag": {"0": 5, "1": 0},
                              "lag_at": time.time()}}}))
    status_file(cfg, "s", archive_only=True).write_text(json.dumps({
        "pid": os.getppid(), "topic": "t", "started_at": 0,
        "lanes": {"archive": {"trigger": "10s", "last_batch": batch},
                  "archive-log": {"trigger": "30s", "topic": "t.delivery-log", "last_batch": {}}}}))
    assert stream_names(cfg) == ["s"]
    screen = "\n".join(stream_lines(cfg, "s", None))
    assert "stream 's': RUNNING" in screen
    assert "archive   last batch 4" in screen and "1,000 alerts archived" in screen, screen
    assert "archive-log no batch with alerts yet in this run, trigger 30s" in screen, screen
    assert "Kafka lag 5 alerts (p0 5, p1 0), measured by the job" in screen, \
        "a lane without a checkpoint (delta-rs): the lag the job measured against its tables"


# A stand-in for ``filter_stream.py --lane archive``: the supervision is what is tested here, not Spark.
CHILD = """
import signal, sys, time
if "--available-now" in sys.argv:
    print("archive batch 0: 7 alerts archived, 0 rejected, done in 0.1 s", flush=True)
    sys.exit(0)
if "--drains" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: (print("archive batch 0: 5 alerts archived, 0 rejected", flush=True),
                                              sys.exit(0)))
print("stream 's' running: archive", flush=True)
if "--dies" in sys.argv:
    sys.exit(3)
time.sleep(60)
"""


@pytest.mark.parametrize("how, archived", [("--drains", 5), ("--dies", 7), ("--killed-by-the-signal", 7)])
def test_a_stopped_archive_process_always_ends_with_what_was_delivered_archived(tmp_path, how, archived):
    """A child that drains on SIGTERM is enough; one that had died, or that the signal kills before it could
    drain (still starting), is followed by a one-shot catch-up run."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    lines: list[str] = []
    child = ArchiveProcess([], nice=0, totals=StreamTotals(), errors_to=tmp_path / "errors.log")
    child.command = [sys.executable, str(script), how]
    with saying(lines):
        child.start()
        assert child.wait_until_running(30)
        if how == "--dies":
            child.process.wait(10)
        assert child.stop(30) == 0
    assert child.totals.archived == archived, lines
    assert any("catching up with a one-shot run" in line for line in lines) == (how != "--drains"), lines


PRIORITY_CHILD = """
import os
from pathlib import Path
group = Path("/proc/self/autogroup")
print(f"nice {os.nice(0)}; session group: {group.read_text().strip() if group.exists() else 'none'}", flush=True)
"""


def test_the_archive_process_yields_the_cores_to_delivery_across_sessions(tmp_path):
    """The child runs in a session of its own, which Linux schedules as one group (autogroup): the group itself
    is niced, else the archive would get half the machine against delivery whatever its nice value."""
    script = tmp_path / "child.py"
    script.write_text(PRIORITY_CHILD)
    lines: list[str] = []
    child = ArchiveProcess([], nice=10, totals=StreamTotals(), errors_to=tmp_path / "errors.log")
    child.command = [sys.executable, str(script)]
    with saying(lines):
        child.start()
        assert child.process.wait(30) == 0
        for relay in child.relays:
            relay.join(10)
    said = next(line for line in lines if line.startswith("nice "))
    assert said.startswith(f"nice {min(os.nice(0) + 10, 19)};"), said
    if os.path.exists("/proc/self/autogroup"):
        assert said.endswith(" nice 10"), f"the child's session group keeps its default priority: {said}"
