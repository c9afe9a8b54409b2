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
import itertools
import json
import threading
import time

import fastavro

from conftest import (
    ARCHIVE_IN_THE_DRIVER,
    DATA,
    consume_avro,
    run_saying,
    saying,
    snr_as_string,
    stream_args,
    stream_folder,
    stream_process,
)
from skyfilter.core.alert_columns import detect
from skyfilter.filtering.decode import decode
from skyfilter.filtering.input_schemas import choose_inputs
from skyfilter.jobs import replay_night
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import KafkaTopicRegistry, subject_for
from skyfilter.schemas.avro import (
    avro_files,
    filled_record,
    read_container,
    rubin_schema,
    rubin_versions,
    schema_text,
    schemaless_body,
)
from skyfilter.schemas.compat import read_problems
from skyfilter.schemas.reader import different_alerts, reader_for, schema_name
from skyfilter.schemas.wire import frame, unframe

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
    reader, unreadable = reader_for([(1, ztf), (2, rubin_schema("11.1"))])
    assert schema_name(reader) == "ztf.alert"
    assert unreadable[2] == "schema id 2 (lsst.v11_1.alert) holds Rubin alerts; this stream reads ZTF alerts"


def test_no_version_poisons_the_reader_in_any_order():
    v9, v10, v11, bad = rubin_schema("9.0"), rubin_schema("10.0"), rubin_schema("11.1"), snr_as_string()
    texts = {9: schema_text(v9), 10: schema_text(v10), 11: schema_text(v11), 66: schema_text(bad)}
    for order in itertools.permutations([9, 11, 66]):
        registered = [10, *order]
        at_start = choose_inputs(TOPIC, {i: texts[i] for i in registered})
        running = choose_inputs(TOPIC, {10: texts[10]})
        for schema_id in order:  # each registered while the stream runs
            running = running.with_writers({schema_id: texts[schema_id]})
        for inputs in (at_start, running):
            assert set(inputs.readable) == {9, 10, 11} and set(inputs.unreadable) == {66}, order
            assert "diaSource.snr: no branch of the reader's union reads a string" in inputs.unreadable[66]
            assert inputs.reader_id == 11 and schema_name(inputs.reader) == "lsst.v11_1.alert"
            assert all(not read_problems(inputs.reader, w) for w in (v9, v10, v11))
    pinned = choose_inputs(TOPIC, {i: texts[i] for i in (10, 11, 66)}, pinned=v10)
    assert pinned.pinned and pinned.reader_id is None and schema_name(pinned.reader) == "lsst.v10_0.alert"
    assert set(pinned.readable) == {10, 11} and set(pinned.unreadable) == {66}


def test_a_version_the_reader_cannot_read_is_a_dead_letter_with_the_reason(spark):
    v10, v11, bad = rubin_schema("10.0"), rubin_schema("11.1"), snr_as_string()
    schemas = choose_inputs(TOPIC, {11: schema_text(v11)}).with_writers({10: schema_text(v10), 66: schema_text(bad)})
    assert list(schemas.readable) == [11, 10] and list(schemas.unreadable) == [66]
    schemas = schemas.not_registered([99])
    rows = [(None, frame(i, schemaless_body(w, filled_record(w))), TOPIC, 0, offset, None, 0)
            for offset, (i, w) in enumerate([(11, v11), (10, v10), (66, bad)])]
    rows.append((None, frame(99, b"\x00"), TOPIC, 0, 3, None, 0))
    decoded = decode(spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA), schemas, detect(v11), 12.0)
    reasons = [r.reject_reason for r in decoded.orderBy("kafka_offset").collect()]
    assert reasons[:2] == [None, None]
    assert reasons[2].startswith("schema id 66 (lsst.v11_1.alert) cannot be read as this stream's alerts: "
                                 "diaSource.snr")
    assert reasons[3] == f"schema id 99 is not registered for topic '{TOPIC}' (subject '{TOPIC}-value')"
    registered = schemas.with_writers({99: schema_text(v10)})
    assert 99 in registered.readable and 99 not in registered.reasons, "an id registered late is read from then on"


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
        "--trigger", "realtime", *ARCHIVE_IN_THE_DRIVER, "--stop-when-idle", "15",
        "--set", "stream.realtime.checkpoint_interval=5s", "--set", "monitoring.port=null",
        "--set", "topics.alerts_partitions=2"])
    halves = []
    for version, seed, first_visit in (("10.0", 51, 1), ("11.1", 52, 3)):
        halves.append(produce(kafka_cfg, ProduceOptions(
            topic=TOPIC, visits=2, alerts_per_visit=25, interval_s=3.0, stamps=True, seed=seed, night=NIGHT,
            first_visit=first_visit, schema_version=version, progress=False)))
    assert job.wait(timeout=400) == 0, "\n".join(lines[-30:])
    assert halves[0].schema_id == first_id != halves[1].schema_id
    assert registry.versions(subject_for(TOPIC)) == [first_id, halves[1].schema_id]
    adopted = [line for line in lines if f"new input schema version, schema id {halves[1].schema_id} "
               f"(lsst.v11_1.alert): the reader from now on (Rubin)" in line]
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
    nocutouts = [json.loads(registry.schema(i)) for i in registry.versions(subject_for("filtered.evo_capped"))]
    assert [schema_name(n) for n in nocutouts] == ["lsst.v10_0.alert_nocutouts", "lsst.v11_1.alert_nocutouts"], \
        "the nocutouts topic follows the input's newest version"
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
        str(kafka_cfg.state_dir), "--no-progress", "--to-topic", f"{TOPIC}.restored"]), spark)
    restored = read_topic(kafka_cfg, f"{TOPIC}.restored")
    assert sorted((m.key, m.value) for m in restored) == sorted((m.key, m.value) for m in inputs)
    assert registry.versions(subject_for(f"{TOPIC}.restored")) == [first_id, halves[1].schema_id]


POISON = "poison.alerts"
POISON_BROKERS = """
brokers:
  poison_bright:
    filters: [bright]
    max_alerts_per_visit: null
    topic: {topic}
"""


def _snr_as_text(registry: KafkaTopicRegistry) -> tuple[int, list[tuple[bytes, bytes]]]:
    """20 alerts of the bad version (snr written as text), registered on the poison topic: (id, messages)."""
    bad = snr_as_string()
    bad_id = registry.register(subject_for(POISON), bad)  # as a REST client does (level NONE): accepted
    messages = []
    for index in range(20):
        record = filled_record(bad)
        record["diaSourceId"] = record["diaSource"]["diaSourceId"] = 990_000 + index
        record["diaSource"]["snr"] = f"{30.0 + index:.1f}"
        messages.append((str(index).encode(), frame(bad_id, schemaless_body(bad, record))))
    return bad_id, messages


def test_a_bad_version_mid_night_never_stops_the_stream_or_its_restarts(kafka_cfg, spark, tmp_path):
    from confluent_kafka import Producer

    from skyfilter.jobs.filter_stream import run

    folder = stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20"},
                           POISON_BROKERS.format(topic="filtered.poison_bright"))
    registry = KafkaTopicRegistry(kafka_cfg)
    registry.register(subject_for(POISON), rubin_schema("10.0"), same_alerts=True)
    lines: list[str] = []
    args = stream_args(kafka_cfg, POISON, folder / "filters", folder / "brokers.yaml",
                       extra=["--trigger", "1s", "--stop-when-idle", "10", "--lane", "delivery"])
    stream = threading.Thread(target=lambda: run_saying(lines, lambda: run(args, spark)))
    stream.start()
    while not any(line.startswith(f"stream '{POISON}' running") for line in lines):
        assert stream.is_alive(), lines[-5:]
        time.sleep(0.3)
    for version, visit in (("10.0", 1), ("11.1", 2)):
        produce(kafka_cfg, ProduceOptions(topic=POISON, visits=1, alerts_per_visit=20, interval_s=0.0, seed=70 + visit,
                                          night=NIGHT, first_visit=visit, schema_version=version, progress=False))
    bad_id, bad_messages = _snr_as_text(registry)
    producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    for key, value in bad_messages:
        producer.produce(POISON, key=key, value=value)
    assert producer.flush(30) == 0
    produce(kafka_cfg, ProduceOptions(topic=POISON, visits=1, alerts_per_visit=20, interval_s=0.0, seed=74,
                                      night=NIGHT, first_visit=4, schema_version="9.0",  # older than the others
                                      progress=False))
    stream.join(timeout=300)
    assert not stream.is_alive()
    assert any(f"schema id {bad_id} (lsst.v11_1.alert) cannot be read as this stream's alerts: diaSource.snr" in line
               and "its alerts go to the dead letters" in line for line in lines), lines

    inputs = read_topic(kafka_cfg, POISON)
    good = [m for m in inputs if unframe(m.value)[0] != bad_id]
    writers = {i: json.loads(registry.schema(i)) for i in {unframe(m.value)[0] for m in good}}
    records = [fastavro.schemaless_reader(io.BytesIO(unframe(m.value)[1]), writers[unframe(m.value)[0]], None)
               for m in good]
    assert len(good) == 60 and len(writers) == 3
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 20}
    assert expected and {m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.poison_bright")} == expected
    letters = read_topic(kafka_cfg, f"{POISON}.deadletter")
    assert sorted(m.value for m in letters) == sorted(v for _, v in bad_messages)
    assert all("diaSource.snr" in m.headers["reason"] for m in letters)

    # every later start, a fresh one included, reads the same way: the bad version never enters the reader
    again = stream_folder(tmp_path / "again", {"bright.sql": "diaSource.snr > 20"},
                          POISON_BROKERS.format(topic="filtered.poison_again"))
    fresh: list[str] = []
    with saying(fresh):
        totals = run(stream_args(kafka_cfg, POISON, again / "filters", again / "brokers.yaml", name="poison_fresh",
                                 extra=["--lane", "delivery"]), spark)
    assert totals.input_alerts == 80 and totals.rejected == 20, fresh
    assert any("read as schema id" in line and f"dead-lettered: schema id {bad_id}" in line for line in fresh), fresh
    assert {m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.poison_again")} == expected
