"""The delivery lane's hot query, checked where Spark decides its cost: the optimized plan and the jobs it runs.

Each alert is decoded once (one ``from_avro``, with the reader schema that
leaves the cutouts out), nothing is cached, and a micro-batch runs one Spark
job, caps and Python filters included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import NEGATIVE_PY, stream_args, stream_folder
from skyfilter.delivery.batch_figures import MATCHED
from skyfilter.delivery.caps import VisitCaps
from skyfilter.delivery.micro_batches import DeliveryLane
from skyfilter.delivery.realtime import RealtimeLane
from skyfilter.delivery.realtime_reads import RealtimeReads
from skyfilter.filtering.decode import alert_field_names
from skyfilter.jobs.filter_stream import run
from skyfilter.lanes.delivery_log import SummaryWriter
from skyfilter.lanes.lane import LaneServices
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.totals import StreamTotals
from skyfilter.plan.quarantine import without_filter
from skyfilter.plan.stream_files import read_stream_files
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA, PlanCell, build_plan, probe_batch
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.spark.internals import (
    compiled_classes,
    executed_plan,
    job_descriptions,
    observed_columns,
    optimized_plan,
    write_checkpoint_files,
)

TOPIC = "plan.alerts"
FILTERS = {
    "bright.sql": "diaSource.snr > 30 AND diaSource.reliability > 0.5",
    "snr.sql": "SELECT alert_id, diaSource.snr FROM alerts WHERE diaSource.snr > 10",
    "negative.py": NEGATIVE_PY,
}
BROKERS = """
brokers:
  p_full:
    filters: [bright, negative]
    max_alerts_per_visit: 5
  p_nocut:
    filters: [bright]
    format: nocutouts
  p_lite:
    filters: [snr]
    format: lite
    max_alerts_per_visit: null
"""


@pytest.fixture(scope="module")
def planned(kafka_cfg, spark, tmp_path_factory):
    folder = stream_folder(tmp_path_factory.mktemp("plan"), FILTERS, BROKERS)
    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=20, interval_s=0.0, stamps=True,
                                      seed=5, night="2026-11-10", progress=False))
    schema = open_registry(kafka_cfg).latest(subject_for(TOPIC))
    files = read_stream_files(folder / "filters", folder / "brokers.yaml")
    plan = build_plan(spark, kafka_cfg, TOPIC, TOPIC, files, schema)
    monitor = StreamMonitor(kafka_cfg, TOPIC, TOPIC)
    lane = DeliveryLane(LaneServices(spark, kafka_cfg, PlanCell(plan), {}, monitor, StreamTotals()), "0s",
                        SummaryWriter(kafka_cfg, "unused"), VisitCaps())
    yield {"plan": plan, "lane": lane, "folder": folder}
    monitor.close()


def unread(spark) -> RealtimeReads:
    """The read marks of a Real-time lane that never runs."""
    return RealtimeReads(spark, "unused", Path("unused"), "unused", {})


def _plan_text(frame) -> str:
    return optimized_plan(frame)


def test_the_delivery_query_decodes_once_without_cutouts_and_caches_nothing(spark, planned):
    raw = spark.createDataFrame([], KAFKA_SOURCE_SCHEMA)
    rows, _ = planned["lane"].outgoing(raw, 0)
    plan = _plan_text(rows)
    assert plan.count("from_avro(") == 1, "each alert is decoded once"
    reader = json.loads(planned["plan"].reader_json)
    assert not [f for f in reader["fields"] if f["name"].startswith("cutout")]
    assert planned["plan"].reader_json in plan, "the reader schema without cutouts is the one from_avro resolves to"
    assert "InMemoryRelation" not in plan, "nothing is cached on the delivery path"
    executed = executed_plan(rows)
    assert executed.count("Exchange hashpartitioning(visit_id") == 1, "the caps are one window over each visit"
    assert "ArrowEvalPython" in executed, "all Python filters in one pandas UDF"
    assert rows.columns == ["topic", "key", "value", "headers"]


def test_the_realtime_query_decodes_once_and_observes_no_field_of_the_alert(spark, planned):
    """Spark's ``observe`` copies every column it is given into its row format: the decoded alert's fields (thousands
    of nested ones) must be gone before it, the re-encodings already made."""
    lane = RealtimeLane(planned["lane"].services, spark.createDataFrame([], KAFKA_SOURCE_SCHEMA),
                        unread(spark), "5 minutes", SummaryWriter(planned["lane"].cfg, "unused"))
    try:
        lane.take_plan()
        assert len(lane.brokers()) == 3, "Real-time Mode serves the capped broker with a Python filter too"
        rows = lane.rows(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), "plan-probe")
    finally:
        lane.close()
    spark.conf.set("spark.sql.debug.maxToStringFields", "100000")  # every projected column printed
    try:
        plan = _plan_text(rows)
    finally:
        spark.conf.unset("spark.sql.debug.maxToStringFields")
    assert plan.count("from_avro(") == 1, "each alert is decoded once"
    assert plan.count("skyfilter_python_filters(") == 1, "its Python filters called once per alert"
    assert plan.count("skyfilter_visit_cap(") == 2, "one cap decision per capped broker (p_full, p_nocut)"
    assert "ArrowEvalPython" not in executed_plan(rows), "no pandas UDF: Real-time Mode would hold its answers"
    columns = set(observed_columns(rows))
    assert not columns & set(alert_field_names(planned["plan"].reader_json)), sorted(columns)
    assert {"_f_snr", "kafka_value"} <= columns and any(c.startswith("_encoded_") for c in columns)
    assert rows.columns == ["topic", "key", "value", "headers"]


def test_a_watchlist_adds_one_pass_over_positions_and_keeps_one_decode(kafka_cfg, spark, tmp_path):
    import pandas as pd

    from skyfilter.watch.store import store

    store(spark, kafka_cfg, "watchlist", "plan_list", pd.DataFrame(
        {"source_id": ["a"], "source_name": [None], "ra": [1.0], "dec": [2.0], "radius_arcsec": [2.0]}), {})
    folder = stream_folder(tmp_path, {"near.sql": "watchlists.plan_list.matched AND diaSource.snr > 5"},
                           "brokers:\n  p_watch:\n    filters: [near]\n    max_alerts_per_visit: null\n")
    schema = open_registry(kafka_cfg).latest(subject_for(TOPIC))
    files = read_stream_files(folder / "filters", folder / "brokers.yaml")
    plan = build_plan(spark, kafka_cfg, TOPIC, "plan-watch", files, schema)
    monitor = StreamMonitor(kafka_cfg, TOPIC, "plan-watch")
    services = LaneServices(spark, kafka_cfg, PlanCell(plan), {}, monitor, StreamTotals())
    lane = DeliveryLane(services, "0s", SummaryWriter(kafka_cfg, "unused"), VisitCaps())
    realtime = RealtimeLane(services, spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), unread(spark),
                            "5 minutes", SummaryWriter(kafka_cfg, "unused"))
    try:
        rows, _ = lane.outgoing(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), 0)
        realtime.take_plan()
        realtime_rows = realtime.rows(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), "plan-probe")
        micro, real = _plan_text(rows), _plan_text(realtime_rows)
        executed = executed_plan(rows)
    finally:
        realtime.close()
        monitor.close()
    assert micro.count("from_avro(") == 1 and real.count("from_avro(") == 1, "each alert is decoded once"
    assert executed.count("ArrowEvalPython") == 1, "one pandas UDF matches the batch's positions"
    assert real.count("skyfilter_python_filters(") == 1, "one call to the filter workers per alert"


def test_without_caps_the_delivery_query_has_no_shuffle(spark, planned):
    plan = planned["plan"]
    uncapped = [b for b in plan.brokers if b.max_alerts_per_visit is None]
    lane = planned["lane"]
    lane.serves = lambda broker, plan: broker in uncapped
    try:
        rows, _ = lane.outgoing(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), 0)
    finally:
        lane.serves = lambda broker, plan: True
    assert "Exchange" not in executed_plan(rows)


def test_later_batches_run_the_code_the_first_one_generated(spark, planned, tmp_path):
    """A literal that changes every batch (its id) would make Spark generate and compile new code for the whole
    alert projection on every batch, and the JIT start over on it: only the first batch may compile."""
    path = tmp_path / "probe"
    probe_batch(spark, planned["plan"]).write.parquet(str(path))  # not a local relation: no folding
    counts = []
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as in a streaming query
    try:
        for batch_id in (101, 102, 103):
            before = compiled_classes(spark)
            rows, _ = planned["lane"].outgoing(spark.read.parquet(str(path)), batch_id)
            rows.write.format("noop").mode("overwrite").save()
            counts.append(compiled_classes(spark) - before)
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert counts[1:] == [0, 0], f"classes compiled per batch: {counts}"


def test_a_micro_batch_is_one_spark_job(kafka_cfg, spark, planned):
    folder = planned["folder"]
    totals = run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml", name="plan_jobs",
                             extra=["--lane", "delivery", "--set", "stream.max_offsets_per_trigger=15"]),
                 spark)
    assert totals.batches >= 3 and totals.input_alerts == 40
    jobs = _jobs_described_as(spark, "skyfilter_delivery_plan_jobs")
    assert len(jobs) == totals.batches, f"{len(jobs)} Spark jobs for {totals.batches} delivery batches: {jobs}"


def _jobs_described_as(spark, text: str) -> list[str]:
    """Descriptions of the jobs Spark ran whose description holds ``text`` (a streaming query names its jobs)."""
    return [description.replace("\n", " ") for description in job_descriptions(spark) if text in description]


def _round_trips(monkeypatch, action) -> int:
    """How many py4j calls to the JVM ``action`` makes.

    Only this thread's calls count, and not the deletes of garbage-collected Java objects: py4j's finalizer
    thread sends those whenever Python's collector runs, and in a long test session that is thousands of
    objects left by earlier tests.
    """
    import threading

    from py4j import protocol
    from py4j.clientserver import JavaClient

    calls = [0]
    send = JavaClient.send_command
    caller = threading.get_ident()
    delete = protocol.MEMORY_COMMAND_NAME + protocol.MEMORY_DEL_SUBCOMMAND_NAME

    def counting(self, command, *args, **kwargs):
        if threading.get_ident() == caller and not command.startswith(delete):
            calls[0] += 1
        return send(self, command, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(JavaClient, "send_command", counting)
        action()
    return calls[0]


def test_a_batch_replays_the_query_built_once_per_plan(spark, planned, monkeypatch):
    lane = planned["lane"]
    lane._program = None
    raw = spark.createDataFrame([], KAFKA_SOURCE_SCHEMA)
    first = _round_trips(monkeypatch, lambda: lane.outgoing(raw, 1))
    later = _round_trips(monkeypatch, lambda: lane.outgoing(raw, 2))
    assert later * 5 < first, (first, later)
    program = lane.program()
    before = lane.plan
    lane.cell.update(lambda plan: without_filter(plan, "negative"))  # what a quarantine does
    assert lane.plan is before and lane.program() is program, "a swap lands at the next batch, not in this one"
    try:
        lane.take_plan()
        assert lane.program() is not program, "a changed plan gets a new query"
        assert "negative" in before.brokers[0].enabled_filters, "the plan a batch runs with never changes"
    finally:
        lane.cell.update(lambda plan: before)
        lane.take_plan()


def test_a_later_batch_replays_the_analysed_plan_with_its_own_rows_id_and_caps(kafka_cfg, spark, planned,
                                                                              monkeypatch):
    """The warm-up's plan, analysed once, serves the stream's batches: the same Kafka rows, figures and cap
    decisions as a plan built and analysed for the batch, at a few dozen JVM calls instead of an analysis."""
    from skyfilter.delivery.program import DeliveryProgram
    from skyfilter.kafka.clients import spark_source_options

    plan = planned["plan"]
    raw = spark.read.format("kafka").options(**spark_source_options(kafka_cfg)).option("subscribe", TOPIC).load()
    rows, observation = DeliveryProgram(spark, plan, plan.brokers, True).apply(raw, 0, VisitCaps())
    rows.write.format("noop").mode("overwrite").save()
    visit, night = min(v.split(":") for v in observation.get["visits"])
    replayed = DeliveryProgram(spark, plan, plan.brokers, dead_letters=True)
    replayed.apply(probe_batch(spark, plan, alerts=3), -1, VisitCaps())[0].count()
    template = replayed._template
    assert template is not None, "the warm-up's batch leaves a template"
    caps = VisitCaps()
    caps.restore([(night, int(visit), "p_full", 3)])  # an earlier batch sent 3 of p_full's 5 for this visit
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as in a streaming query's batches
    try:
        for batch_id, batch in ((5, raw.where("offset < 0")), (6, raw)):
            calls = _round_trips(monkeypatch, lambda b=batch, i=batch_id: replayed.apply(b, i, caps))
            assert calls < 200, f"{calls} JVM calls to replay the plan"
            rows, observation = replayed.apply(batch, batch_id, caps)
            built, built_observation = DeliveryProgram(spark, plan, plan.brokers, True).apply(batch, batch_id, caps)
            assert replayed._template is template, "replayed, not built again"
            assert _kafka_rows(rows) == _kafka_rows(built)
            assert _figures(observation.get) == _figures(built_observation.get)
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    logged = [json.loads(r.value) for r in rows.collect() if r.topic == plan.delivery_log_topic]
    assert logged and {record["batch_id"] for record in logged} == {6}
    to_full = [r for r in logged if r["visit_id"] == int(visit) and "p_full" in {b["broker"] for b in r["brokers"]}]
    assert 0 < len(to_full) <= 2, "3 of p_full's 5 were already sent for this visit"


def test_the_caps_memory_sits_in_the_plan_once_whatever_the_capped_brokers(spark, planned):
    """What earlier batches delivered is looked up once per alert: a night's map of visits in the plan once per
    capped broker would grow every batch's task binary with each visit (measured: 8.6 MiB at 3,000 visits and
    20 capped brokers)."""
    from dataclasses import replace

    from skyfilter.delivery.program import DeliveryProgram

    plan = planned["plan"]
    all_capped = [replace(b, max_alerts_per_visit=5) for b in plan.brokers]
    caps = VisitCaps()
    caps.restore([("2026-11-10", 7, b.name, 1) for b in all_capped])
    rows, _ = DeliveryProgram(spark, plan, all_capped, True).apply(probe_batch(spark, plan, alerts=3), 3, caps)
    assert _plan_text(rows).count("map(keys: [") == 1


def test_python_workers_import_pyspark_from_its_package_not_from_sparks_archives(spark):
    """Each task re-reads the directory of every archive on a worker's path (0.1 s per task with Spark's
    zips and jar there): the workers start from ``skyfilter.spark.python_daemon``, without them."""
    def worker_paths(_):
        import sys

        import pyspark
        return [[pyspark.__file__, *sys.path]]

    [paths] = spark.sparkContext.parallelize([0], 1).mapPartitions(worker_paths).collect()
    assert "site-packages" in paths[0] and ".zip" not in paths[0]
    assert not [p for p in paths[1:] if p.endswith(".jar") or "pyspark.zip" in p or "py4j" in p]


def _processes_started() -> int:
    """Processes this machine has started since boot (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        return int(next(line for line in stat if line.startswith("processes")).split()[1])


def test_checkpoint_files_are_written_without_starting_a_process_per_call(spark, tmp_path):
    """A stream writes two checkpoint files per batch.  Spark's default writer (Hadoop's FileContext) starts
    about 20 processes per file on a local disk (chmod, readlink); the one in spark-defaults.conf about 4."""
    files = 20
    before = _processes_started()
    write_checkpoint_files(spark, tmp_path.as_uri(), [str(batch) for batch in range(files)],
                           b'v1\n{"batchWatermarkMs":0}\n')
    started = _processes_started() - before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(map(str, range(files)))
    assert started < 10 * files, f"{started} processes started for {files} checkpoint files"


def _kafka_rows(frame) -> list[tuple]:
    return sorted((r.topic, r.key, r.value, str(r.headers)) for r in frame.collect())


def _figures(observed: dict) -> dict:
    """A batch's observed figures, without what depends on the order tasks finish in or on time taken."""
    figures = {k: sorted(map(str, v)) if isinstance(v, list) else v for k, v in observed.items()
               if k != "python_reports"}
    figures[MATCHED] = sorted((observed.get(MATCHED) or "").split(","))
    return figures
