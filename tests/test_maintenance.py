"""Maintenance compacts a night written by many small batches; the data reads back identical."""

from __future__ import annotations

from conftest import saying, stream_args, write_files
from skyfilter.jobs import maintain
from skyfilter.jobs.filter_stream import run
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce

TOPIC = "maint.alerts"


def files_on_disk(path) -> int:
    return sum(1 for f in path.rglob("*.parquet"))


def snapshot(spark, path) -> list:
    frame = spark.read.format("delta").load(str(path))
    return sorted(tuple(row) for row in frame.select(*sorted(frame.columns)).collect())


def test_maintenance_compacts_small_files_and_keeps_the_data(kafka_cfg, spark, tmp_path):
    write_files(tmp_path / "filters", {"any.sql": "diaSource.snr > 10"})
    (tmp_path / "brokers.yaml").write_text("max_alerts_per_visit: null\nbrokers:\n  maint_b:\n    filters: [any]\n")
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=30, interval_s=0.0, stamps=False,
                                      seed=5, night="2026-11-10", progress=False))
    args = stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml",
                       extra=["--set", "stream.max_offsets_per_trigger=20",
                              "--set", "archive.max_offsets_per_trigger=20"])
    totals = run(args, spark)
    assert totals.batches >= 3
    tables = table_paths(kafka_cfg, TOPIC)
    before = {t: snapshot(spark, tables[t]) for t in ("alerts", "matches")}
    disk_before = files_on_disk(tables["alerts"])
    lines: list[str] = []
    with saying(lines):
        report = maintain.run(maintain.parse_args(
            ["--name", TOPIC, "--state-dir", str(kafka_cfg.state_dir), "--vacuum-hours", "0",
             "--set", "maintenance.tables=[alerts,matches]"]), spark)
    assert report["alerts"]["nights"] == ["2026-11-10"]
    assert report["alerts"]["files_before"] >= 3 and report["alerts"]["files_after"] == 1
    assert files_on_disk(tables["alerts"]) < disk_before
    for table, rows in before.items():
        assert snapshot(spark, tables[table]) == rows, f"{table} reads back identical"
    assert any(line.startswith("alerts: ") and "-> 1 files" in line for line in lines)
