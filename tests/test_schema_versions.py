"""Every Rubin alert schema lsst-alert-packet ships (3.0 ... 11.1), and ZTF 4.02, goes through with no config:
produced, filtered, archived and restored byte for byte; the real ZTF 3.3 samples run in test_stream_real_alerts."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from conftest import DATA, rewrite_as_ztf_402, stream_args, write_files
from skyfilter.core.alert_columns import detect
from skyfilter.core.avro_schemas import avro_files, rubin_schema, rubin_versions
from skyfilter.core.delivery import read_topic
from skyfilter.core.wire import unframe
from skyfilter.jobs import replay_night
from skyfilter.jobs.filter_stream import run
from skyfilter.producers.command import ProduceOptions, produce

NIGHT = "2026-11-18"
BROKERS = "max_alerts_per_visit: null\nbrokers:\n  ver_full:\n    filters: [detected]\n"


@pytest.mark.parametrize("version", rubin_versions())
def test_each_rubin_schema_version_is_filtered_archived_and_restored(kafka_cfg, spark, tmp_path, version):
    topic = f"ver.{version.replace('.', '_')}"
    write_files(tmp_path / "filters", {"detected.sql": "diaSource.snr > 5"})
    (tmp_path / "brokers.yaml").write_text(BROKERS.replace("ver_full", f"ver_{version.replace('.', '_')}"))
    report = produce(kafka_cfg, ProduceOptions(topic=topic, visits=1, alerts_per_visit=8, interval_s=0,
                                               stamps=True, seed=5, night=NIGHT, schema_version=version,
                                               progress=False), log=lambda line: None)
    assert report.alerts == 8 and report.failures == 0
    lines: list[str] = []
    totals = run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml"), spark, lines.append)
    schema = rubin_schema(version)
    columns = detect(schema)
    assert any(f"(schema id {report.schema_id}, {columns.family})" in line for line in lines), lines[:3]
    assert totals.input_alerts == 8 and totals.rejected == 0

    inputs = read_topic(kafka_cfg, topic)
    parsed = fastavro.parse_schema(schema)
    records = [fastavro.schemaless_reader(io.BytesIO(unframe(m.value)[1]), parsed, None) for m in inputs]
    expected = sorted(str(r[columns.alert_id]) for r in records if r["diaSource"]["snr"] > 5)
    delivered = read_topic(kafka_cfg, f"filtered.ver_{version.replace('.', '_')}")
    assert expected and sorted(m.headers["alert_id"] for m in delivered) == expected
    alerts = spark.read.format("delta").load(str(kafka_cfg.delta_dir / topic / "alerts"))
    assert alerts.count() == alerts.select("alert_id").distinct().count() == 8

    replay_night.run(replay_night.parse_args([
        "--night", NIGHT, "--name", topic, "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir",
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{topic}.restored"]), spark, lambda line: None)
    restored = read_topic(kafka_cfg, f"{topic}.restored")
    assert sorted((m.key, m.value) for m in restored) == sorted((m.key, m.value) for m in inputs)


def test_ztf_4_02_is_recognised_filtered_archived_and_restored(kafka_cfg, spark, tmp_path):
    """ZTF's schema 4.02 (no alerts of it are published): the real 3.3 alerts read with it, written as 4.02."""
    schema = json.loads((DATA / "ztf-4.02" / "alert.avsc").read_text())
    folder = tmp_path / "ztf402"
    folder.mkdir()
    for path in avro_files([DATA / "ztf-3.3"])[:12]:
        rewrite_as_ztf_402(path, folder / path.name)
    topic = "ver.ztf_4_02"
    write_files(tmp_path / "filters", {"detected.sql": "candidate.magpsf < 19"})
    (tmp_path / "brokers.yaml").write_text(BROKERS.replace("ver_full", "ver_ztf402"))
    report = produce(kafka_cfg, ProduceOptions(topic=topic, from_paths=[str(folder)], interval_s=0, progress=False),
                     log=lambda line: None)
    assert report.alerts == 12 and report.failures == 0
    lines: list[str] = []
    totals = run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml"), spark, lines.append)
    assert any(f"(schema id {report.schema_id}, ztf)" in line for line in lines), lines[:3]
    assert totals.input_alerts == 12 and totals.rejected == 0

    inputs = read_topic(kafka_cfg, topic)
    parsed = fastavro.parse_schema(schema)
    decoded = [fastavro.schemaless_reader(io.BytesIO(unframe(m.value)[1]), parsed, None) for m in inputs]
    assert all("fp_hists" in r for r in decoded)
    expected = sorted(str(r["candid"]) for r in decoded if r["candidate"]["magpsf"] < 19)
    assert expected and sorted(m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.ver_ztf402")) == expected
    night = spark.read.format("delta").load(str(kafka_cfg.delta_dir / topic / "alerts")).first().night
    replay_night.run(replay_night.parse_args([
        "--night", night, "--name", topic, "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir",
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{topic}.restored"]), spark, lambda line: None)
    restored = read_topic(kafka_cfg, f"{topic}.restored")
    assert sorted((m.key, m.value) for m in restored) == sorted((m.key, m.value) for m in inputs)
