"""The run plan: what a stream job decides before it starts, settled once from the config and the files, and the
values it is made of (frozen brokers, plans compared by value, lanes named once).  Pure: no Kafka, no Spark."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from skyfilter.core.brokers import BrokerSpec, load_brokers
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LANE_CHOICES, LaneName
from skyfilter.local.memory import process_tree_rss
from skyfilter.local.processes import command_line, is_running
from skyfilter.local.status import LANES
from skyfilter.plan.run_plan import BrokerNeeds, fit_to_slots, realtime_refusal, settle_run, with_slots
from skyfilter.plan.slots import Slots, configured_master
from skyfilter.plan.stream_plan import frozen_value
from skyfilter.plan.triggers import Triggers

SQL = "SELECT * FROM alerts WHERE diaSource.psfFlux > 0"
PY = ("from skyfilter import alert_filter\n\n"
      "@alert_filter(columns=['diaSource.psfFlux'])\ndef f(flux):\n    return flux > 0\n")


@pytest.fixture()
def cfg(tmp_path) -> Config:
    """The repository's config on a scratch state dir, with one SQL, one Python filter and three brokers."""
    (tmp_path / "filters").mkdir()
    (tmp_path / "filters" / "bright.sql").write_text(SQL)
    (tmp_path / "filters" / "positive.py").write_text(PY)
    (tmp_path / "brokers.yaml").write_text(
        "brokers:\n  sql_only:\n    filters: [bright]\n    max_alerts_per_visit: null\n"
        "  python:\n    filters: [positive]\n    max_alerts_per_visit: null\n"
        "  capped:\n    filters: [bright]\n")
    return Config.load(ROOT / "conf" / "local.yaml", {
        "state_dir": str(tmp_path), "stream.filters_dir": str(tmp_path / "filters"),
        "stream.brokers": str(tmp_path / "brokers.yaml"), "stream.trigger": "0", "stream.tasks": "auto",
        "archive.process": "auto", "archive.tasks": 1})


@pytest.mark.parametrize("lane_choice, available_now, apart, here", [
    ("both", False, True, frozenset({"delivery", "archive"})),
    ("both", True, False, frozenset({"delivery", "archive"})),
    ("delivery", False, False, frozenset({"delivery"})),
    ("archive", False, False, frozenset({"archive"})),
])
def test_lanes_and_the_archives_place_are_settled_once(cfg, lane_choice, available_now, apart, here):
    run, auto_line = settle_run(cfg, "night", lane_choice, available_now, "local[2]")
    assert (run.lanes, run.archive_apart, auto_line) == (here, apart, "")
    assert run.archive_here == (LaneName.ARCHIVE in here and not apart)
    if available_now:
        assert run.triggers == Triggers("availableNow", "availableNow", "", "availableNow")
    slots = with_slots(run, cfg).slots  # micro-batches: no Kafka is asked
    assert slots.delivery == (2 if LaneName.DELIVERY in here else 0)
    assert (slots.archive, slots.archive_log) == ((1, 1) if run.archive_here else (0, 0))


def test_a_run_plan_is_frozen(cfg):
    run, _ = settle_run(cfg, "night", "both", False, "local[2]")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.archive_apart = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.triggers.delivery = "5s"


def test_auto_sends_every_broker_to_real_time_mode_unless_a_setting_keeps_one_out(cfg):
    cfg = cfg.with_values({"stream.trigger": "auto"})
    run, line = settle_run(cfg, "night", "both", False, "local[2]")
    assert run.realtime and not run.micro_batches and run.batch_brokers == ()
    assert line == "trigger auto -> realtime: Real-time Mode serves every broker (SQL and Python filters, caps)"
    cfg = cfg.with_values({"stream.realtime.python_filters": False})
    run, line = settle_run(cfg, "night", "both", False, "local[2]")
    assert run.triggers.delivery == "0s" and not run.realtime and run.micro_batches
    assert line == ("trigger auto -> 0: broker(s) python need micro-batches (stream.realtime settings): "
                    "micro-batches back to back")


def test_real_time_mode_leaves_brokers_to_micro_batches_by_one_rule(cfg):
    cfg = cfg.with_values({"stream.trigger": "realtime"})
    cfg = cfg.with_values({"stream.realtime.caps": False})
    run, _ = settle_run(cfg, "night", "delivery", False, "local[2]")
    assert run.realtime and run.micro_batches
    assert run.batch_brokers == (("capped", "a per-visit cap (stream.realtime.caps is off)"),)
    cluster, _ = settle_run(cfg, "night", "delivery", False, "spark://127.0.0.1:7077")
    assert [name for name, _ in cluster.batch_brokers] == ["capped"], "the same rule on a cluster"


def test_the_one_rule_names_every_reason():
    on = Config.load(ROOT / "conf" / "local.yaml").stream.realtime
    assert realtime_refusal(BrokerNeeds(False), on) is None
    assert realtime_refusal(BrokerNeeds(True, ("a",), watch=True), on) is None, \
        "on every master: workers beside each executor, caps asked of the driver"


def test_the_run_is_settled_once_for_the_master_spark_will_run_on(cfg, tmp_path, monkeypatch):
    run = with_slots(settle_run(cfg, "night", "both", False, "local[2]")[0], cfg)
    assert run.archive_apart and run.slots == Slots(2, 0, 0, 0)
    cluster = settle_run(cfg, "night", "both", False, "spark://127.0.0.1:7077")[0]
    assert not cluster.archive_apart and with_slots(cluster, cfg, 6).slots == Slots(6, 0, 1, 1), \
        "a cluster: one JVM, its cores sized once Spark says how many"
    # outside spark-submit, the master is the one of the defaults file the session will read
    (tmp_path / "spark-defaults.conf").write_text("# a cluster\nspark.master=spark://head:7077\n"
                                                  "spark.driver.memory 2g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert configured_master() == "spark://head:7077"
    (tmp_path / "spark-defaults.conf").write_text("spark.master   local[3]\n")
    assert configured_master() == "local[3]"
    (tmp_path / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert configured_master() == "local[*]", "Spark's own default"


@pytest.mark.parametrize("trigger", ["auto", "realtime"])
def test_trigger_auto_falls_back_to_micro_batches_on_a_cluster_with_too_few_slots(cfg, trigger):
    cfg = cfg.with_values({"stream.trigger": trigger})
    settled, _ = settle_run(cfg, "night", "delivery", False, "spark://127.0.0.1:7077")
    run = dataclasses.replace(settled, slots=Slots(0, 4, 0, 0))  # a 4-partition topic
    assert run.realtime
    assert fit_to_slots(run, cfg, 4) == (run, ""), "4 slots hold the 4 long-lived tasks"
    fitted, line = fit_to_slots(run, cfg, 3)
    if trigger == "realtime":
        assert (fitted, line) == (run, ""), "asked for by name: the stream says what it needs, and stops"
        return
    assert not fitted.realtime and fitted.micro_batches and fitted.triggers.delivery == "0s"
    assert fitted.slots == Slots(3, 0, 0, 0), "every slot to the micro-batches"
    assert line.startswith("trigger auto -> 0: Real-time Mode needs 4 task slots") and "Spark has 3" in line


@pytest.mark.parametrize("key, value, message", [
    ("archive.process", "apart", "archive.process is 'apart': use auto, same or separate"),
    ("stream.trigger", "fast", "'fast' is not a duration like 500ms, 5s or 1m"),
    ("archive.trigger", "10 sec", "'10 sec' is not a duration like 500ms, 5s or 1m"),
    ("archive.writer", "rust", "archive.writer is 'rust': use auto, spark or delta-rs"),
])
def test_a_wrong_setting_is_one_line_before_anything_starts(cfg, key, value, message):
    with pytest.raises(SkyfilterError) as refused:
        settle_run(cfg.with_values({key: value}), "night", "both", False, "local[2]")
    assert str(refused.value) == message


def test_the_delta_rs_writer_refuses_nightly_topics_in_one_line(cfg):
    cfg = cfg.with_values({"archive.writer": "delta-rs"})
    assert settle_run(cfg, "night", "both", False, "local[2]")[0].archive_apart
    cfg = cfg.with_values({"stream.nightly_topics.enabled": True})
    with pytest.raises(SkyfilterError, match="^archive.writer delta-rs does not copy alerts to nightly topics yet"):
        settle_run(cfg, "night", "both", False, "local[2]")


def test_auto_archive_writer_is_delta_rs_unless_the_archive_needs_spark(cfg):
    """``auto`` (the default) writes the archive without Spark, except where only Spark's queries can: nightly
    topics, or a stream whose alerts table holds the layout before the raw one."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from skyfilter.plan.tables import table_paths

    cfg = cfg.with_values({"archive.writer": "auto"})
    run, line = settle_run(cfg, "night", "both", False, "local[2]")
    assert run.archive_writer == "delta-rs" and "archive.writer" not in line
    cfg = cfg.with_values({"stream.nightly_topics.enabled": True})
    run, line = settle_run(cfg, "night", "both", False, "local[2]")
    assert run.archive_writer == "spark" and "nightly topics" in line
    cfg = cfg.with_values({"stream.nightly_topics.enabled": False})
    write_deltalake(str(table_paths(cfg, "decoded")["alerts"]),
                    pa.table({"alert_id": ["1"], "night": ["2026-11-01"], "diaSource": [{"snr": 5.0}]}))
    run, line = settle_run(cfg, "decoded", "both", False, "local[2]")
    assert run.archive_writer == "spark" and "holds the layout before the raw one" in line
    assert settle_run(cfg, "night", "both", False, "local[2]")[0].archive_writer == "delta-rs", "per stream"
    cfg = cfg.with_values({"archive.writer": "spark"})
    assert settle_run(cfg, "night", "both", False, "local[2]")[0].archive_writer == "spark"


def test_brokers_are_values(cfg):
    first, second = load_brokers(cfg.path("stream.brokers")), load_brokers(cfg.path("stream.brokers"))
    assert first == second and len({*first, *second}) == 3, "equal settings, equal (and hashable) brokers"
    assert first[0].filters == ("bright",) and isinstance(BrokerSpec("b", ["x"], "t").enabled_filters, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].enabled_filters = ("bright",)
    assert dataclasses.replace(first[0], enabled_filters=["bright"]) != first[0]
    assert dataclasses.replace(first[0], line=99) == first[0], "moved in the file, the same broker"
    assert first[0].delivery == ("sql_only", "filtered.sql_only", "full", "confluent", None, ())


def test_frozen_values_compare_by_content():
    @dataclasses.dataclass
    class Part:
        items: list
        where: Path

    one = {"b": Part([1, {"x": 2}], Path("/a")), "a": {3, 1}}
    two = {"a": {1, 3}, "b": Part([1, {"x": 2}], Path("/a"))}
    assert frozen_value(one) == frozen_value(two) and hash(frozen_value(one)) == hash(frozen_value(two))
    two["b"].items[1]["x"] = 3
    assert frozen_value(one) != frozen_value(two)


def test_lanes_are_named_once():
    assert [str(lane) for lane in LANES] == ["realtime", "delivery", "archive", "archive-log"]
    assert LaneName("archive-log") is LaneName.ARCHIVE_LOG and f"{LaneName.DELIVERY:<9}|" == "delivery |"
    assert LANE_CHOICES["both"] == {"delivery", "archive"}


def test_processes_are_read_with_psutil(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 30  # a loaded machine may show the new process before its command line
        while not command_line(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_running(child.pid) and command_line(child.pid)[1:] == ["-c", "import time; time.sleep(30)"]
        assert child.pid in process_tree_rss(child.pid)
    finally:
        child.kill()
    assert child.wait(10) is not None
    assert not is_running(child.pid) and command_line(child.pid) == [] and not is_running(None)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while is_running(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(exited.pid).status() == psutil.STATUS_ZOMBIE, "exited, not yet reaped"
    assert not is_running(exited.pid)
    exited.wait(10)
