"""Pure functions behind Real-time Mode for every broker and the archive's CPU share (no Kafka, no Spark)."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest

from skyfilter.core.config import Config
from skyfilter.core.config_types import Realtime
from skyfilter.filtering.filter_workers import (
    FRAME,
    answer,
    answer_all,
    one_verdict,
    verdict_marks,
)
from skyfilter.local.cpu_share import idle_group
from skyfilter.plan.run_plan import BrokerNeeds, broker_needs, realtime_refusal, settle_triggers
from skyfilter.plan.stream_files import read_stream_files
from skyfilter.schemas.avro import only_paths, rubin_schema

RAISES = """
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr"])
def raises(snr):
    raise ValueError("no")
"""
BRIGHT = """
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr", "diaSource.band"])
def bright(snr, band):
    return (snr > 10) & (band != "u")
"""
HISTORY = """
import numpy as np

from skyfilter import alert_filter


@alert_filter(columns=["prvDiaSources.psfFlux"])
def history(fluxes):
    return np.array([f is not None and len(f) > 1 and float(np.max(f)) > 5 for f in fluxes])
"""


def _filter_set(folder: Path, sources: dict[str, str], schema: pa.Schema, budget_s: float = 2.0) -> None:
    filters = []
    columns = [field.name for field in schema]
    for name, source in sources.items():
        path = folder / f"{name}.py"
        path.write_text(source)
        wanted = {"raises": ["c0"], "bright": ["c0", "c1"], "history": ["c2"], "counts": ["c0"]}[name]
        filters.append({"name": name, "path": str(path), "source": source, "function": name,
                        "positions": [columns.index(c) for c in wanted]})
    encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
    (folder / "set1.json").write_text(json.dumps({"filters": filters, "budget_s": budget_s, "schema": encoded}))


def test_a_filter_worker_answers_one_alert_as_a_pandas_udf_would_see_it(tmp_path):
    schema = pa.schema([pa.field("c0", pa.float32()), pa.field("c1", pa.string()),
                        pa.field("c2", pa.list_(pa.float64()))])
    _filter_set(tmp_path, {"bright": BRIGHT, "history": HISTORY, "raises": RAISES}, schema)
    sets: dict = {}

    def ask(row: dict) -> str:
        return answer(b"set1\n" + json.dumps(row).encode(), tmp_path, sets)

    first = ask({"alert_id": "7", "c0": 50.0, "c1": "g", "c2": [1.0, 9.0]})
    verdicts, _, failures = first.partition("\n")
    assert verdicts == "11n", "bright, history matched; raises gave no verdict"
    assert json.loads(failures)["raises"]["error"] == "ValueError: no"
    assert json.loads(failures)["raises"]["sample"] == "7"
    assert ask({"alert_id": "8", "c0": 5.0, "c1": "u", "c2": None}) == "00n", "a failed filter is not called again"
    assert ask({"alert_id": "9", "c0": None, "c1": None, "c2": []}) == "00n", "nulls are NaN / None, as in a UDF"


def test_alerts_waiting_together_are_answered_with_one_call_per_filter(tmp_path):
    schema = pa.schema([pa.field("c0", pa.float32()), pa.field("c1", pa.string()),
                        pa.field("c2", pa.list_(pa.float64()))])
    _filter_set(tmp_path, {"bright": BRIGHT, "raises": RAISES}, schema)
    rows = [{"alert_id": str(i), "c0": snr, "c1": band, "c2": None}
            for i, (snr, band) in enumerate([(50.0, "g"), (5.0, "g"), (None, "r"), (70.0, "u")])]
    replies = answer_all([b"set1\n" + json.dumps(row).encode() for row in rows], tmp_path, {})
    assert [reply.split("\n")[0] for reply in replies] == ["1n", "0n", "0n", "0n"]
    assert "\n" in replies[0] and not any("\n" in reply for reply in replies[1:]), "the failure said once"
    assert json.loads(replies[0].split("\n", 1)[1])["raises"]["sample"] == "0"


def test_the_worker_process_waits_briefly_for_the_other_tasks_and_calls_each_filter_once(tmp_path):
    calls = tmp_path / "calls.txt"
    counts = RAISES.replace("def raises(snr):", "def counts(snr):").replace(
        'raise ValueError("no")', f"open({str(calls)!r}, 'a').write(f'{{len(snr)}}\\n')\n    return snr > 10")
    path = tmp_path / "worker.sock"
    worker = subprocess.Popen([sys.executable, "-m", "skyfilter.filtering.filter_workers", "--socket", str(path)])
    try:
        _filter_set(tmp_path, {"counts": counts}, pa.schema([pa.field("c0", pa.float32())]))
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        tasks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        for task in tasks:
            task.connect(str(path))
        time.sleep(0.2)  # the worker has taken the three connections in
        for snr, task in zip([50.0, 5.0, 20.0], tasks, strict=True):  # three tasks' alerts, as a burst sends them
            request = b"set1\n" + json.dumps({"alert_id": "a", "c0": snr}).encode()
            task.sendall(FRAME.pack(len(request)) + request)
        replies = [_reply(task) for task in tasks]
        assert replies == ["1", "0", "1"]
        assert calls.read_text().split() == ["3"], "one call for the three alerts"
        began = time.monotonic()
        request = b'set1\n{"alert_id": "b", "c0": 30.0}'
        tasks[0].sendall(FRAME.pack(len(request)) + request)  # a lone alert while the other tasks are idle
        assert _reply(tasks[0]) == "1" and time.monotonic() - began < 1.0
        assert calls.read_text().split() == ["3", "1"]
        for task in tasks:
            task.close()
    finally:
        worker.terminate()
        worker.wait(10)


def _reply(task: socket.socket) -> str:
    size = FRAME.unpack(task.recv(FRAME.size, socket.MSG_WAITALL))[0]
    return task.recv(size, socket.MSG_WAITALL).decode()


def test_a_filter_worker_interrupts_a_filter_that_hangs(tmp_path):
    hangs = RAISES.replace('raise ValueError("no")', "import time\n    time.sleep(60)")
    schema = pa.schema([pa.field("c0", pa.float32())])
    _filter_set(tmp_path, {"raises": hangs}, schema, budget_s=0.5)
    reply = answer(b'set1\n{"alert_id": "1", "c0": 3.0}', tmp_path, {})
    assert reply.startswith("n\n") and "0.5 s budget" in json.loads(reply.split("\n", 1)[1])["raises"]["error"]


def test_one_verdict_takes_one_boolean_and_refuses_anything_else():
    import numpy as np
    import pandas as pd

    assert one_verdict(pd.Series([True])) is True and one_verdict(np.array([False])) is False
    assert one_verdict(pd.Series([None], dtype="boolean")) is None
    for wrong, says in ((pd.Series([True, False]), "2 values for 1"), (pd.Series([1.5]), "float"),
                        (True, "bool"), (pd.DataFrame({"a": [True]}), "DataFrame")):
        with pytest.raises(TypeError, match=says):
            one_verdict(wrong)


def test_verdict_marks_take_a_batch_of_booleans_and_refuse_the_wrong_length_or_kind():
    import numpy as np
    import pandas as pd

    assert verdict_marks(pd.Series([True, False, True], index=[7, 8, 9]), 3) == ["1", "0", "1"]
    assert verdict_marks(np.array([False, True]), 2) == ["0", "1"]
    assert verdict_marks(pd.Series([None, True], dtype="boolean"), 2) == ["n", "1"]
    assert verdict_marks(pd.Series([None]), 1) == ["n"]
    for wrong, rows, says in ((pd.Series([True, False, True]), 2, "3 values for 2"),
                              (pd.Series([1.0, 2.0]), 2, "float"), (pd.Series([True]), 2, "1 values for 2")):
        with pytest.raises(TypeError, match=says):
            verdict_marks(wrong, rows)


def test_brokers_go_to_micro_batches_only_when_the_settings_say_so():
    on, off = Realtime("5m", 500, True, True, 3000, 1000), Realtime("5m", 500, False, False, 3000, 1000)
    assert realtime_refusal(BrokerNeeds(True, ("fast_riser",), True), on) is None
    assert realtime_refusal(BrokerNeeds(True, ("f",)), off) == (
        "a per-visit cap (stream.realtime.caps is off); Python filter(s) f (stream.realtime.python_filters is off)")


def test_auto_picks_realtime_for_the_repository_filters_and_brokers():
    root = Path(__file__).resolve().parents[1]
    needs = broker_needs(read_stream_files(root / "filters", root / "conf" / "brokers.yaml"))
    cfg = Config.load()
    cfg = cfg.with_values({"stream.trigger": "auto"})
    triggers, why = settle_triggers(cfg, False, needs)
    assert triggers.delivery == "realtime", why
    assert why == "trigger auto -> realtime: Real-time Mode serves every broker (SQL and Python filters, caps)"
    cfg = cfg.with_values({"stream.realtime.python_filters": False})
    triggers, why = settle_triggers(cfg, False, needs)
    assert triggers.delivery == "0s" and why.startswith("trigger auto -> 0: broker(s) ") and "stream.realtime" in why


def test_the_raw_archives_reader_keeps_only_the_index_fields_and_still_resolves():
    schema = rubin_schema("10.0")
    pruned = only_paths(schema, ["diaSourceId", "diaSource.visit", "diaSource.midpointMjdTai"])
    assert [f["name"] for f in pruned["fields"]] == ["diaSourceId", "diaSource"]
    source = pruned["fields"][1]["type"]
    source = source if isinstance(source, dict) else next(t for t in source if isinstance(t, dict))
    assert [f["name"] for f in source["fields"]] == ["visit", "midpointMjdTai"]
    fastavro.parse_schema(pruned)
    assert only_paths(schema, []) == {**schema, "fields": []}


def test_an_idle_cgroup_is_made_where_the_hierarchy_allows_and_refused_with_a_reason_elsewhere(tmp_path):
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.shares").write_text("1024")
    group, how = idle_group("skyfilter-test", v1)
    assert how == "cgroup v1" and (v1 / "cpu" / "skyfilter-test" / "cpu.shares").read_text() == "2"
    assert group is not None and not group.idle  # a plain folder has no cpu.idle
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory")
    group, how = idle_group("skyfilter-test", v2)
    assert how == "cgroup v2" and (v2 / "skyfilter-test" / "cpu.weight").read_text() == "1"
    assert idle_group("x", tmp_path / "none") == (None, "no cgroup hierarchy with the cpu controller")
