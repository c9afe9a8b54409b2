"""Rewindable nights: archive layout, byte-exact replay at scaled cadence, re-filtering, time travel."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest
from pyspark.sql import functions as F

from conftest import ARCHIVE_IN_THE_DRIVER, NEGATIVE_PY, saying, stream_args, stream_folder, write_files
from skyfilter.archive.layout import archived_schema, with_cutouts
from skyfilter.archive.night_reader import NightSelection, read_alerts
from skyfilter.jobs import replay_night
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce

TOPIC = "night.alerts"
NIGHT = "2026-11-16"
FILTERS = {
    "bright.sql": "diaSource.snr > 30 AND diaSource.reliability > 0.5",
    "negative.py": NEGATIVE_PY,
}
BROKERS = "max_alerts_per_visit: null\nbrokers:\n  night_full:\n    filters: [bright, negative]\n  night_nocut:\n" \
          "    filters: [negative]\n    format: nocutouts\n"


def replay_args(cfg, *extra: str):
    return replay_night.parse_args(["--night", NIGHT, "--name", TOPIC, "--bootstrap", cfg.bootstrap_servers,
                                    "--state-dir", str(cfg.state_dir), "--no-progress", *extra])


@pytest.fixture(scope="module")
def night(kafka_cfg, spark, tmp_path_factory):
    folder = stream_folder(tmp_path_factory.mktemp("night"), FILTERS, BROKERS)
    report = produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=3, alerts_per_visit=25, interval_s=3.0,
                                               stamps=True, seed=11, night=NIGHT, progress=False))
    run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml"), spark)
    originals = read_topic(kafka_cfg, TOPIC)
    return {"report": report, "folder": folder, "originals": originals, "tables": table_paths(kafka_cfg, TOPIC)}


def test_alerts_are_stored_once_with_their_message_and_the_images_decode_from_it(night, spark):
    tables = night["tables"]
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    assert not [c for c in alerts.columns if c.startswith("cutout")], "alert scans never read images"
    assert alerts.count() == alerts.select("alert_id").distinct().count() == 75
    by_offset = {(m.partition, m.offset): m.value for m in night["originals"]}
    stored = {(r.kafka_partition, r.kafka_offset): bytes(r.kafka_value)
              for r in alerts.select("kafka_partition", "kafka_offset", "kafka_value").collect()}
    assert stored == by_offset, "each alert keeps its original message, byte for byte"
    _, schema_json = archived_schema(spark, tables["schemas"])
    images = with_cutouts(alerts, json.loads(schema_json))
    assert {"cutoutDifference", "cutoutScience", "cutoutTemplate"} <= set(images.columns)
    assert images.where(F.length("cutoutScience") < 10_000).count() == 0, "real FITS images, decoded on read"


def test_replay_to_a_new_topic_is_byte_identical_in_order_with_scaled_gaps(kafka_cfg, spark, night):
    result = replay_night.run(replay_args(kafka_cfg, "--to-topic", "night.replay", "--speed", "10"), spark)
    assert result == {"alerts": 75, "visits": 3, "elapsed": result["elapsed"]}
    replayed = read_topic(kafka_cfg, "night.replay")
    originals = night["originals"]
    assert len(replayed) == len(originals) == 75
    by_partition = defaultdict(list)
    for message in originals:
        by_partition[message.partition].append((message.key, message.value))
    replayed_by_partition = defaultdict(list)
    for message in replayed:
        replayed_by_partition[message.partition].append((message.key, message.value))
    assert replayed_by_partition == by_partition, "same bytes, same partition, same order within it"

    def visit_starts(messages):
        starts = {}
        for message in sorted(messages, key=lambda m: m.timestamp_ms):
            starts.setdefault(message.key[:-5], message.timestamp_ms)  # alert id = visit id * 1e5 + index
        return sorted(starts.values())

    original_gaps = [b - a for a, b in zip(visit_starts(originals), visit_starts(originals)[1:], strict=False)]
    replay_gaps = [b - a for a, b in zip(visit_starts(replayed), visit_starts(replayed)[1:], strict=False)]
    assert all(abs(gap - 3000) < 600 for gap in original_gaps), original_gaps
    for original, scaled in zip(original_gaps, replay_gaps, strict=True):
        assert abs(scaled - original / 10) < 250, (original_gaps, replay_gaps)


def test_replayed_topic_runs_through_the_stream_unchanged(kafka_cfg, spark, night):
    replay_night.run(replay_args(kafka_cfg, "--to-topic", "night.replay2", "--visits", "2-3"), spark)
    folder = night["folder"]
    totals = run(stream_args(kafka_cfg, "night.replay2", folder / "filters", folder / "brokers.yaml"), spark)
    assert totals.input_alerts == 50 and totals.rejected == 0


def test_refiltering_a_night_yields_exactly_the_stream_matches(kafka_cfg, spark, night):
    folder = night["folder"]
    result = replay_night.run(replay_args(kafka_cfg, "--filters-dir", str(folder / "filters"), "--brokers",
                                          str(folder / "brokers.yaml")), spark)
    assert result["alerts"] == 75
    columns = ["alert_id", "broker", F.array_join("filters", ",").alias("filters")]
    streamed = spark.read.format("delta").load(str(night["tables"]["matches"])).where(F.col("night") == NIGHT)
    refiltered = spark.read.format("delta").load(result["table"]).where(F.col("night") == NIGHT)
    expected = sorted(tuple(r) for r in streamed.select(*columns).collect())
    assert expected and sorted(tuple(r) for r in refiltered.select(*columns).collect()) == expected
    per_broker = {b: sum(1 for r in expected if r[1] == b) for b in {r[1] for r in expected}}
    assert {b: n for b, n in result["by_broker"].items() if n} == per_broker

    lines: list[str] = []
    with saying(lines):
        shown = replay_night.run(replay_args(kafka_cfg, "--show-matches", "--limit", "3"), spark)
    assert shown["by_broker"] == per_broker and shown["matches"] == len(expected)
    assert [line for line in lines if line.startswith("  broker ")] == [
        f"  broker {b}: {n} alerts" for b, n in sorted(per_broker.items())]
    assert sum(line.startswith("  visit ") for line in lines) == 3
    assert lines[-1] == f"night {NIGHT}: {len(expected)} re-filtered matches in {result['table']}"


def test_time_travel_returns_the_archive_as_it_was(kafka_cfg, spark, night):
    from delta.tables import DeltaTable

    path = str(night["tables"]["alerts"])
    last_commit = DeltaTable.forPath(spark, path).history(1).first()
    before, committed_at = last_commit.version, last_commit.timestamp
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=10, interval_s=0.0, stamps=False,
                                      seed=12, night=NIGHT, progress=False, first_visit=4))
    folder = night["folder"]
    run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml"), spark)
    tables = night["tables"]
    assert read_alerts(spark, tables, NightSelection(NIGHT)).count() == 85
    assert read_alerts(spark, tables, NightSelection(NIGHT, as_of_version=before)).count() == 75
    as_of = committed_at.strftime("%Y-%m-%d %H:%M:%S.%f")
    assert read_alerts(spark, tables, NightSelection(NIGHT, as_of_timestamp=as_of)).count() == 75


def test_nightly_topic_holds_the_night_and_replay_recreates_it(kafka_cfg, spark, tmp_path):
    from skyfilter.archive.nightly_topics import nightly_topic
    from skyfilter.kafka.topics import admin_client

    topic, night = "nightly.alerts", "2026-11-15"
    write_files(tmp_path / "filters", FILTERS)
    (tmp_path / "brokers.yaml").write_text("max_alerts_per_visit: null\n"
                                           "brokers:\n  nightly_b:\n    filters: [bright]\n")
    produce(kafka_cfg, ProduceOptions(topic=topic, visits=2, alerts_per_visit=15, interval_s=0.0, stamps=False,
                                      seed=3, night=night, progress=False))
    run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml",
                    extra=["--set", "stream.nightly_topics.enabled=true"]), spark)

    def by_partition(messages):
        grouped = defaultdict(list)
        for message in messages:
            grouped[message.partition].append(message.value)
        return dict(grouped)

    originals = by_partition(read_topic(kafka_cfg, topic))
    nightly = nightly_topic(topic, night)
    assert by_partition(read_topic(kafka_cfg, nightly)) == originals
    admin = admin_client(kafka_cfg)
    admin.delete_topics([nightly], operation_timeout=30)[nightly].result()
    for _ in range(50):  # deletion is asynchronous
        if nightly not in admin.list_topics(timeout=10).topics:
            break
        time.sleep(0.2)
    replay_night.run(replay_night.parse_args(
        ["--night", night, "--name", topic, "--to-topic", nightly, "--bootstrap", kafka_cfg.bootstrap_servers,
         "--state-dir", str(kafka_cfg.state_dir), "--no-progress"]), spark)
    assert by_partition(read_topic(kafka_cfg, nightly)) == originals


def test_same_night_through_two_triggers_gives_a_latency_throughput_table(kafka_cfg, spark, night):
    from skyfilter.jobs.trigger_report import markdown, trigger_rows

    folder = night["folder"]
    for trigger in ("0", "2s"):
        topic = f"night.trigger{trigger}"
        replay_night.run(replay_args(kafka_cfg, "--to-topic", topic, "--visits", "1-3", "--speed", "5"), spark)
        run(stream_args(kafka_cfg, topic, folder / "filters", folder / "brokers.yaml",
                        extra=["--trigger", trigger, "--stop-when-idle", "3", "--starting-offsets", "earliest",
                               *ARCHIVE_IN_THE_DRIVER]),
            spark)
    rows = {row["stream"]: row for row in trigger_rows(spark, kafka_cfg, ["night.trigger0", "night.trigger2s"])}
    assert rows["night.trigger0"]["trigger"] == "0s" and rows["night.trigger2s"]["trigger"] == "2s"
    for row in rows.values():
        assert row["alerts"] == 75
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["alerts_per_s"] > 0
    assert "| night.trigger0 | 0s |" in markdown(list(rows.values()))
