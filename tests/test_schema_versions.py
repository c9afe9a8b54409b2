"""Every Rubin alert schema lsst-alert-packet ships (3.0 ... 11.1), and ZTF 4.02, goes through with no config:
produced, filtered, archived and restored byte for byte; the real ZTF 3.3 samples run in test_stream_real_alerts.

Rubin's versions come in families that name the same columns (alert id, time, visit, position).  Each family
is one night on one topic, every version of it registered in turn and sending its own visit, so one stream
reads them all: each alert decoded with its own writer schema, filtered, archived with that schema's id.
"""

from __future__ import annotations

import io
import json
from itertools import groupby

import fastavro
import pytest

from conftest import DATA, rewrite_as_ztf_402, saying, stream_args, write_files
from skyfilter.core.alert_columns import detect
from skyfilter.jobs import replay_night
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import avro_files, rubin_schema, rubin_versions
from skyfilter.schemas.wire import unframe

NIGHT = "2026-11-18"
BROKERS = "max_alerts_per_visit: null\nbrokers:\n  ver_full:\n    filters: [detected]\n"
PER_VERSION = 8
FAMILIES = {family: list(versions) for family, versions in
            groupby(rubin_versions(), key=lambda version: detect(rubin_schema(version)).family)}


def test_rubin_versions_fall_into_families_of_neighbouring_versions():
    assert [v for versions in FAMILIES.values() for v in versions] == rubin_versions()
    assert FAMILIES["rubin"][-1] == "11.1" and len(FAMILIES) >= 4


@pytest.mark.parametrize("family", FAMILIES)
def test_each_rubin_schema_version_is_filtered_archived_and_restored(kafka_cfg, spark, tmp_path, family):
    versions = FAMILIES[family]
    topic = f"ver.{family.replace('-', '_')}"
    broker = f"ver_{family.replace('-', '_')}"
    write_files(tmp_path / "filters", {"detected.sql": "diaSource.snr > 5"})
    (tmp_path / "brokers.yaml").write_text(BROKERS.replace("ver_full", broker))
    schema_ids = {}
    for index, version in enumerate(versions):  # one visit per version, each version registered in turn
        report = produce(kafka_cfg, ProduceOptions(
            topic=topic, visits=1, alerts_per_visit=PER_VERSION, interval_s=0, stamps=True, seed=5 + index,
            night=NIGHT, first_visit=1 + index, schema_version=version, progress=False))
        assert report.alerts == PER_VERSION and report.failures == 0
        schema_ids[report.schema_id] = version
    assert len(schema_ids) == len(versions)
    lines: list[str] = []
    with saying(lines):
        totals = run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml"), spark)
    assert any(f"(schema id {report.schema_id}, {family})" in line for line in lines), lines[:3]
    assert totals.input_alerts == PER_VERSION * len(versions) and totals.rejected == 0

    inputs = read_topic(kafka_cfg, topic)
    writers = {i: rubin_schema(version) for i, version in schema_ids.items()}
    parsed = {i: fastavro.parse_schema(schema) for i, schema in writers.items()}
    expected = []
    for message in inputs:
        schema_id, body = unframe(message.value)
        record = fastavro.schemaless_reader(io.BytesIO(body), parsed[schema_id], None)
        if record["diaSource"]["snr"] > 5:
            expected.append(str(record[detect(writers[schema_id]).alert_id]))
    delivered = read_topic(kafka_cfg, f"filtered.{broker}")
    assert expected and sorted(m.headers["alert_id"] for m in delivered) == sorted(expected)
    alerts = spark.read.format("delta").load(str(kafka_cfg.delta_dir / topic / "alerts"))
    assert alerts.count() == alerts.select("alert_id").distinct().count() == len(inputs)
    by_schema = {row.schema_id: row["count"] for row in alerts.groupBy("schema_id").count().collect()}
    assert by_schema == {schema_id: PER_VERSION for schema_id in schema_ids}, "each alert with its writer's id"

    replay_night.run(replay_night.parse_args([
        "--night", NIGHT, "--name", topic, "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir",
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{topic}.restored"]), spark)
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
    report = produce(kafka_cfg, ProduceOptions(topic=topic, from_paths=[str(folder)], interval_s=0, progress=False))
    assert report.alerts == 12 and report.failures == 0
    lines: list[str] = []
    with saying(lines):
        totals = run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml"), spark)
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
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{topic}.restored"]), spark)
    restored = read_topic(kafka_cfg, f"{topic}.restored")
    assert sorted((m.key, m.value) for m in restored) == sorted((m.key, m.value) for m in inputs)
