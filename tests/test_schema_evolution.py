"""Schema evolution on input: a night that moves from Rubin 10.0 to 11.1 halfway, with the stream running.

The stream starts on 10.0 alone.  The producer then registers 11.1 as a new
version of the topic's subject and sends the second half with it.  Nothing
may be dead-lettered, the filters must see both halves (broker topics equal
an independent evaluation, each alert decoded with its own writer schema),
standard clients must decode the ``full`` topic's two versions through the
registry, the archive must keep each alert's writer schema id, and replay
must re-emit the exact bytes.  Pure-function tests of the reader schema sit
beside it.
"""

from __future__ import annotations

import io

import fastavro

from conftest import DATA, consume_avro, stream_folder, stream_process
from skyfilter.core.alert_columns import detect
from skyfilter.core.avro_schemas import (
    avro_files,
    filled_record,
    read_container,
    rubin_schema,
    rubin_versions,
    schema_text,
    schemaless_body,
)
from skyfilter.core.delivery import read_topic
from skyfilter.core.reader_schema import different_alerts, reader_for, schema_name
from skyfilter.core.registry import KafkaTopicRegistry, subject_for
from skyfilter.core.schema_compat import read_problems
from skyfilter.core.wire import frame, unframe
from skyfilter.jobs import replay_night
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.stream.decode import decode
from skyfilter.stream.input_schemas import InputSchemas
from skyfilter.stream.stream_plan import KAFKA_SOURCE_SCHEMA
from skyfilter.stream.tables import table_paths

TOPIC = "evo.alerts"
NIGHT = "2026-11-20"
BROKERS = """
brokers:
  evo_full:
    filters: [bright]
    max_alerts_per_visit: null
  evo_lite:
    filters: [snr10]
    format: lite
    max_alerts_per_visit: null
  evo_capped:
    filters: [bright]
    format: nocutouts
    max_alerts_per_visit: 4
"""


def test_every_rubin_version_reads_as_the_newest_widened():
    versions = rubin_versions()
    writers = [(index, rubin_schema(v)) for index, v in enumerate(versions)]
    reader, unreadable = reader_for(writers)
    assert unreadable == {}
    assert all(read_problems(reader, writer) == [] for _, writer in writers)
    assert read_problems(rubin_schema("11.1"), rubin_schema("10.0")), "11.1 as published cannot read 10.0"
    source = next(f["type"] for f in reader["fields"] if f["name"] == "diaSource")
    record = source if isinstance(source, dict) else next(b for b in source if isinstance(b, dict))
    psf_ndata = next(f for f in record["fields"] if f["name"] == "psfNdata")
    assert psf_ndata["type"][0] == "null" and psf_ndata["default"] is None


def test_other_surveys_alerts_are_not_a_version():
    ztf = read_container(avro_files([DATA / "ztf-3.3"])[0])[0]
    assert different_alerts(rubin_schema("10.0"), rubin_schema("11.1")) is None
    assert "top-level fields" in different_alerts(rubin_schema("11.1"), ztf)
    _, unreadable = reader_for([(1, ztf), (2, rubin_schema("11.1"))])
    assert "not the same alerts" in unreadable[1]


def test_a_version_the_reader_cannot_read_is_a_dead_letter_with_the_reason(spark):
    v10, v11 = rubin_schema("10.0"), rubin_schema("11.1")
    schemas = InputSchemas(TOPIC, v11, {11: schema_text(v11)}).with_writers({10: schema_text(v10)})
    assert list(schemas.readable) == [11] and "psfNdata: a null cannot be read as a int" in schemas.unreadable[10]
    schemas = schemas.not_registered([99])
    rows = [(None, frame(11, schemaless_body(v11, filled_record(v11))), TOPIC, 0, 0, None, 0),
            (None, frame(10, schemaless_body(v10, filled_record(v10))), TOPIC, 0, 1, None, 0),
            (None, frame(99, b"\x00"), TOPIC, 0, 2, None, 0)]
    decoded = decode(spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA), schemas, detect(v11), 12.0)
    reasons = [r.reject_reason for r in decoded.orderBy("kafka_offset").collect()]
    assert reasons[0] is None
    assert "schema id 10 (lsst.v10_0.alert) cannot be read as this stream's alerts" in reasons[1]
    assert "restarting the stream widens its reader" in reasons[1]
    assert reasons[2] == f"schema id 99 is not registered for topic '{TOPIC}' (subject '{TOPIC}-value')"


def _independent(records: list[dict]) -> dict[str, set[str]]:
    ids = {"evo_full": set(), "evo_lite": set()}
    for record in records:
        if record["diaSource"]["snr"] > 20:
            ids["evo_full"].add(str(record["diaSourceId"]))
        if record["diaSource"]["snr"] > 10:
            ids["evo_lite"].add(str(record["diaSourceId"]))
    return ids


def test_a_night_moving_from_10_0_to_11_1_while_the_stream_runs(kafka_cfg, spark, registry_url, tmp_path):
    stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20",
                                       "snr10.sql": "SELECT alert_id, diaSource.snr FROM alerts "
                                                    "WHERE diaSource.snr > 10"}, BROKERS)
    registry = KafkaTopicRegistry(kafka_cfg)
    first_id = registry.register(subject_for(TOPIC), rubin_schema("10.0"), same_alerts=True)
    job, lines = stream_process(kafka_cfg, TOPIC, tmp_path, [
        "--trigger", "realtime", "--archive-trigger", "2s", "--stop-when-idle", "15",
        "--set", "stream.realtime.checkpoint_interval=5s", "--set", "monitoring.port=null",
        "--set", "topics.alerts_partitions=2"])
    halves = []
    for version, seed, first_visit in (("10.0", 51, 1), ("11.1", 52, 3)):
        halves.append(produce(kafka_cfg, ProduceOptions(
            topic=TOPIC, visits=2, alerts_per_visit=25, interval_s=3.0, stamps=True, seed=seed, night=NIGHT,
            first_visit=first_visit, schema_version=version, progress=False), log=lambda line: None))
    assert job.wait(timeout=400) == 0, "\n".join(lines[-30:])
    assert halves[0].schema_id == first_id != halves[1].schema_id
    assert registry.versions(subject_for(TOPIC)) == [first_id, halves[1].schema_id]
    adopted = [line for line in lines if f"new input schema version, schema id {halves[1].schema_id} "
               f"(lsst.v11_1.alert): decoded from now on" in line]
    assert adopted and all(line.startswith(("realtime lane", "delivery lane", "archive lane")) for line in adopted)

    inputs = read_topic(kafka_cfg, TOPIC)
    writers = {first_id: rubin_schema("10.0"), halves[1].schema_id: rubin_schema("11.1")}
    records = []
    for message in inputs:
        schema_id, body = unframe(message.value)
        records.append(fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(writers[schema_id]), None))
    assert len(records) == 100 and {unframe(m.value)[0] for m in inputs} == set(writers)
    assert read_topic(kafka_cfg, f"{TOPIC}.deadletter") == []
    expected = _independent(records)
    bright_ids = {unframe(m.value)[0] for m, r in zip(inputs, records, strict=True)
                  if str(r["diaSourceId"]) in expected["evo_full"]}
    assert bright_ids == set(writers), "bright alerts in both halves"
    # Real-time Mode delivers at least once: a restart resends what it sent since its last checkpoint
    full = read_topic(kafka_cfg, "filtered.evo_full")
    assert {m.headers["alert_id"] for m in full} == expected["evo_full"]
    by_id = {str(r["diaSourceId"]): m for r, m in zip(records, inputs, strict=True)}
    assert all(m.value == by_id[m.headers["alert_id"]].value for m in full)
    lite = read_topic(kafka_cfg, "filtered.evo_lite")
    assert {m.headers["alert_id"] for m in lite} == expected["evo_lite"]
    capped = {m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.evo_capped")}  # resent, not more
    assert len(capped) == 16 and capped <= expected["evo_full"], "4 per visit, the same after a restart"
    decoded = consume_avro(kafka_cfg, registry_url, "filtered.evo_full", len(full))
    assert {str(v["diaSourceId"]) for v in decoded} == expected["evo_full"]

    tables = table_paths(kafka_cfg, TOPIC)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    assert alerts.count() == 100 == alerts.select("alert_id").distinct().count()
    assert {r.schema_id: r["count"] for r in alerts.groupBy("schema_id").count().collect()} == {
        first_id: 50, halves[1].schema_id: 50}
    archived = spark.read.format("delta").load(str(tables["schemas"])).collect()
    assert {r.schema_id: schema_name(r.schema_json) for r in archived} == {
        first_id: "lsst.v10_0.alert", halves[1].schema_id: "lsst.v11_1.alert"}

    replay_night.run(replay_night.parse_args([
        "--night", NIGHT, "--name", TOPIC, "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir",
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{TOPIC}.restored"]), spark, lambda line: None)
    restored = read_topic(kafka_cfg, f"{TOPIC}.restored")
    assert sorted((m.key, m.value) for m in restored) == sorted((m.key, m.value) for m in inputs)
    assert registry.versions(subject_for(f"{TOPIC}.restored")) == [first_id, halves[1].schema_id]
