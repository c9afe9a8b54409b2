"""A Python filter that raises, or overruns its time budget, is quarantined; the others keep delivering."""

from __future__ import annotations

import json

from conftest import decode_messages, saying, stream_args, write_files
from skyfilter.cli import main
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.quarantine import Quarantine
from skyfilter.plan.reload import PlanReloader
from skyfilter.plan.stream_files import read_stream_files
from skyfilter.plan.stream_plan import PlanCell, build_plan
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

TOPIC = "quar.alerts"
FILTERS = {
    "everything.sql": "diaSource.snr > 3",
    "breaks_on_visit2.py": '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.visit", "diaSource.snr"])
def breaks_on_visit2(visit, snr):
    if (visit % 100000 == 2).any():
        raise RuntimeError("visit 2 is too much for me")
    return snr > 3
''',
    "slow.py": '''
import time

from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr"])
def slow(snr):
    time.sleep(1.2)
    return snr > 3
''',
}
BROKERS = ("max_alerts_per_visit: null\n"
           "brokers:\n  q_all:\n    filters: [everything]\n  q_breaks:\n    filters: [breaks_on_visit2]\n"
           "  q_slow:\n    filters: [slow]\n")


def test_failing_and_slow_filters_are_quarantined_and_the_others_deliver_everything(kafka_cfg, spark, tmp_path,
                                                                                    capsys):
    write_files(tmp_path / "filters", FILTERS)
    (tmp_path / "brokers.yaml").write_text(BROKERS)
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=3, alerts_per_visit=20, interval_s=0.0, stamps=False,
                                      seed=8, night="2026-11-11", progress=False))
    lines: list[str] = []
    args = stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml",
                       extra=["--set", "stream.max_offsets_per_trigger=15", "--set", "stream.filter_time_budget_s=1"])
    with saying(lines):
        totals = run(args, spark)
    assert totals.batches >= 4 and totals.input_alerts == 60

    bootstrap = kafka_cfg
    inputs = read_topic(bootstrap, TOPIC)
    records = decode_messages(inputs, rubin_schema("10.0"))
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 3}
    assert len(expected) > 0
    assert sorted(m.headers["alert_id"] for m in read_topic(bootstrap, "filtered.q_all")) == sorted(expected)
    broken_deliveries = read_topic(bootstrap, "filtered.q_breaks")
    assert all(m.headers["alert_id"][:-5].endswith("00001") for m in broken_deliveries), "only visit-1 alerts"

    assert any("filter 'breaks_on_visit2' quarantined" in line and "visit 2 is too much" in line for line in lines)
    assert any("filter 'slow' quarantined" in line and "1 s budget" in line for line in lines)
    events = [json.loads(m.value) for m in read_topic(bootstrap, "skyfilter.errors") if m.key != b"x"]
    mine = {e["filter"]: e for e in events if e["stream"] == TOPIC}
    assert mine["breaks_on_visit2"]["broker"] == "q_breaks"
    assert "visit 2 is too much" in mine["breaks_on_visit2"]["error"]
    assert mine["breaks_on_visit2"]["sample_alert_id"] in {str(r["diaSourceId"]) for r in records}
    assert mine["slow"]["broker"] == "q_slow"

    tables = table_paths(kafka_cfg, TOPIC)
    status = spark.read.format("delta").load(str(tables["filter_status"])).collect()
    assert sorted((r.filter, r.state) for r in status) == [("breaks_on_visit2", "quarantined"),
                                                          ("slow", "quarantined")]
    metrics = spark.read.format("delta").load(str(tables["metrics"])).where("lane = 'delivery'") \
        .orderBy("batch_id").collect()
    assert "breaks_on_visit2" not in metrics[-1].matches_by_filter, "not evaluated after quarantine"
    assert sum(m.matches_by_filter["everything"] for m in metrics) == len(expected)

    capsys.readouterr()
    assert main(["filters", "status", "--name", TOPIC, "--state-dir", str(kafka_cfg.state_dir)]) == 0
    shown = capsys.readouterr().out
    assert "breaks_on_visit2  python  quarantined  raised on batch" in shown
    assert "everything        sql     enabled" in shown
    assert "1 enabled, 2 quarantined, 0 broken, 0 unused" in shown

    again: list[str] = []
    with saying(again):
        run(args, spark)  # a restart keeps unchanged quarantined filters off
    assert any("filter 'breaks_on_visit2' stays quarantined" in line for line in again)

    # a hot reload leaves quarantined filters off, and says nothing of them, until their files change
    files = read_stream_files(tmp_path / "filters", tmp_path / "brokers.yaml")
    cell = PlanCell(build_plan(spark, kafka_cfg, TOPIC, TOPIC, files, (0, "")))
    reloads: list[str] = []
    with saying(reloads):
        quarantine = Quarantine(spark, kafka_cfg, cell)
        reloader = PlanReloader(spark, kafka_cfg, cell, tmp_path / "filters", tmp_path / "brokers.yaml",
                                quarantine.held_off)
        (tmp_path / "filters" / "everything.sql").write_text("diaSource.snr > 4")
        reloader.reload()
        (tmp_path / "filters" / "everything.sql").write_text("diaSource.snr > 3")
        reloader.reload()
    assert [line for line in reloads if line.startswith("reload: ")] == ["reload: filter(s) changed: everything"] * 2
    assert {spec.name for spec in cell.current.filters} == {"everything"}
