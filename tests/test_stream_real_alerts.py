"""End to end on real alerts (ZTF 3.3 and Rubin v10 as redistributed by Fink), each on its own topic.

The files are replayed byte for byte; every broker topic must hold exactly the
alerts a fastavro + plain-Python evaluation of the same filters selects.
"""

from __future__ import annotations

import glob
import json

import fastavro
import pytest
from pyspark.sql import functions as F

from conftest import DATA, check_topic, expected_deliveries, stream_args, write_files
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import cutout_fields
from skyfilter.schemas.wire import unframe

ZTF_FILTERS = {
    "ztf_bright.sql": "candidate.magpsf < 15.5 AND candidate.isdiffpos = 't'",
    "ztf_real.py": '''
from skyfilter import alert_filter


@alert_filter(columns=["candidate.rb"])
def ztf_real(rb):
    return rb > 0.45
''',
}
ZTF_BROKERS = """
max_alerts_per_visit: null  # these tests compare every match
brokers:
  ztf_full:
    filters: [ztf_bright, ztf_real]
  ztf_nocut:
    filters: [ztf_real]
    format: nocutouts
"""
ZTF_PREDICATES = {
    "ztf_bright": lambda a: a["candidate"]["magpsf"] < 15.5 and a["candidate"]["isdiffpos"] == "t",
    "ztf_real": lambda a: a["candidate"]["rb"] > 0.45,
}

LSST_FILTERS = {
    "lsst_snr.sql": "diaSource.snr > 20",
    "lsst_reliable.py": '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.reliability"])
def lsst_reliable(reliability):
    return reliability > 0.9
''',
}
LSST_BROKERS = """
max_alerts_per_visit: null  # these tests compare every match
brokers:
  lsst_full:
    filters: [lsst_snr, lsst_reliable]
"""
LSST_PREDICATES = {
    "lsst_snr": lambda a: a["diaSource"]["snr"] > 20,
    "lsst_reliable": lambda a: (a["diaSource"]["reliability"] or 0) > 0.9,
}


def file_records(paths: list[str], id_field: str) -> dict[str, dict]:
    """Alert id -> record, read from the container files with fastavro alone."""
    records = {}
    for path in paths:
        with open(path, "rb") as handle:
            for record in fastavro.reader(handle):
                records[str(record[id_field])] = record
    return records


def replay_and_filter(cfg, spark, folder, topic, paths, filters, brokers_yaml):
    write_files(folder / "filters", filters)
    (folder / "brokers.yaml").write_text(brokers_yaml)
    report = produce(cfg, ProduceOptions(topic=topic, from_paths=paths, progress=False))
    totals = run(stream_args(cfg, topic, folder / "filters", folder / "brokers.yaml"), spark)
    inputs = read_topic(cfg, topic)
    return report, totals, {m.headers.get("alert_id") or m.key.decode(): m for m in inputs}


@pytest.fixture(scope="module")
def ztf(kafka_cfg, spark, tmp_path_factory):
    paths = sorted(glob.glob(str(DATA / "ztf-3.3" / "*.avro")))
    return (*replay_and_filter(kafka_cfg, spark, tmp_path_factory.mktemp("ztf"), "ztf.alerts", paths,
                               ZTF_FILTERS, ZTF_BROKERS), file_records(paths, "candid"))


@pytest.fixture(scope="module")
def lsst(kafka_cfg, spark, tmp_path_factory):
    paths = [str(DATA / "lsst-v10" / "fink-lsst-v10-7alerts.avro")]
    return (*replay_and_filter(kafka_cfg, spark, tmp_path_factory.mktemp("lsst"), "lsst.alerts", paths,
                               LSST_FILTERS, LSST_BROKERS), file_records(paths, "diaSourceId"))


def test_ztf_replay_keeps_each_record_byte_for_byte(ztf):
    report, totals, inputs, records = ztf
    assert report.alerts == 50 == len(inputs) == totals.archived
    for alert_id, message in inputs.items():
        with open(DATA / "ztf-3.3" / f"{alert_id}.avro", "rb") as handle:
            (block,) = list(fastavro.block_reader(handle))  # one alert per file, one block
        assert block.num_records == 1
        assert unframe(message.value)[1] == block.bytes_.getvalue()


def test_ztf_broker_topics_hold_exactly_the_expected_alerts(kafka_cfg, ztf):
    _, _, inputs, records = ztf
    expected = expected_deliveries(records, {
        "ztf_full": [(n, ZTF_PREDICATES[n]) for n in ("ztf_bright", "ztf_real")],
        "ztf_nocut": [("ztf_real", ZTF_PREDICATES["ztf_real"])]})
    assert 0 < len(expected["ztf_nocut"]) < len(expected["ztf_full"]) < 50
    check_topic(read_topic(kafka_cfg, "filtered.ztf_full"), expected["ztf_full"], inputs, True)
    check_topic(read_topic(kafka_cfg, "filtered.ztf_nocut"), expected["ztf_nocut"], inputs, False)


def test_ztf_archive_holds_every_alert_once(kafka_cfg, spark, ztf):
    _, _, _, records = ztf
    rows = spark.read.format("delta").load(str(kafka_cfg.delta_dir / "ztf.alerts" / "alerts")) \
        .select("alert_id", "night").collect()
    assert sorted(r.alert_id for r in rows) == sorted(records)
    # JD 2458850.078 is 2020-01-01 13:52 UTC; minus the 12 h offset: night 2020-01-01.
    assert {r.night for r in rows} == {"2020-01-01"}


def test_fink_rubin_alerts_are_filtered_and_archived(kafka_cfg, spark, lsst):
    report, totals, inputs, records = lsst
    assert report.alerts == 7 == totals.archived
    expected = expected_deliveries(records, {
        "lsst_full": [(n, LSST_PREDICATES[n]) for n in ("lsst_snr", "lsst_reliable")]})
    assert 0 < len(expected["lsst_full"]) < 7
    check_topic(read_topic(kafka_cfg, "filtered.lsst_full"), expected["lsst_full"], inputs, True)
    rows = spark.read.format("delta").load(str(kafka_cfg.delta_dir / "lsst.alerts" / "alerts")) \
        .select("alert_id", "visit_id").collect()
    assert sorted(r.alert_id for r in rows) == sorted(records)
    assert {r.visit_id for r in rows} == {a["diaSource"]["visit"] for a in records.values()}


@pytest.mark.parametrize("dataset", ["ztf", "lsst"])
def test_archived_real_alerts_restore_to_the_original_bytes(kafka_cfg, spark, dataset, request):
    from skyfilter.archive.night_reader import NightSelection, read_messages
    from skyfilter.plan.tables import table_paths

    _, _, inputs, _ = request.getfixturevalue(dataset)
    tables = table_paths(kafka_cfg, f"{dataset}.alerts")
    nights = [r.night for r in spark.read.format("delta").load(str(tables["alerts"])).select("night").distinct()
              .collect()]
    restored = {}
    for night in nights:
        messages, _ = read_messages(spark, tables, NightSelection(night))
        assert "byte_identical" not in messages.columns, "the archive keeps the messages themselves"
        restored.update({r.alert_id: bytes(r.kafka_value) for r in messages.select("alert_id", "kafka_value")
                         .collect()})
    assert restored == {alert_id: message.value for alert_id, message in inputs.items()}


@pytest.mark.parametrize("dataset", ["ztf", "lsst"])
def test_archives_of_the_earlier_layout_restore_to_the_original_bytes(kafka_cfg, spark, dataset, request):
    """Archives written before the message column (images in a ``cutouts`` table, a hash of each message):
    the fields are re-encoded with the writer schema, the images rejoined, each checked against its hash."""
    from skyfilter.archive.layout import (
        LEGACY_HASH_COLUMN,
        MESSAGE_KEY,
        archived_schema,
        restore_legacy_messages,
        with_cutouts,
        with_fields,
    )
    from skyfilter.plan.tables import table_paths
    from skyfilter.schemas.avro import without_fields

    _, _, inputs, _ = request.getfixturevalue(dataset)
    tables = table_paths(kafka_cfg, f"{dataset}.alerts")
    schema_id, schema_json = archived_schema(spark, tables["schemas"])
    schema = json.loads(schema_json)
    cutouts = cutout_fields(schema)
    raw = spark.read.format("delta").load(str(tables["alerts"]))
    current = with_cutouts(with_fields(raw, {schema_id: schema_json}, without_fields(schema, cutouts, None)), schema)
    legacy_alerts = current.withColumn(LEGACY_HASH_COLUMN, F.xxhash64("kafka_value")).drop("kafka_value", *cutouts)
    legacy_images = current.select("alert_id", *MESSAGE_KEY, *cutouts)
    restored = restore_legacy_messages(legacy_alerts, legacy_images, schema_json, schema_id) \
        .select("alert_id", "kafka_value", "byte_identical").collect()
    assert all(r.byte_identical for r in restored)
    assert {r.alert_id: bytes(r.kafka_value) for r in restored} == \
        {alert_id: message.value for alert_id, message in inputs.items()}
