"""Every private Spark API skyfilter uses, run on the pinned Spark: an upgrade that breaks one fails here, by name.

Each function of ``skyfilter/spark/internals.py`` registered with ``@internal`` has a probe below; a
probe that fails shows the function, the Spark version and why skyfilter needs it (SparkInternalsError).
"""

from __future__ import annotations

import socket
import uuid

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

from skyfilter.delivery.caps import VISIT_CAP_FUNCTION
from skyfilter.local.processes import command_line
from skyfilter.spark import internals
from skyfilter.spark.internals import INTERNALS, SparkInternalsError, internal
from skyfilter.spark.plan_template import PlanTemplate


def _frame(spark):
    return spark.createDataFrame([(1, "a", 7.0), (2, "b", 70.0)], "alert_id long, band string, snr double")


def probe_active_context(spark):
    assert internals.active_context() is spark.sparkContext


def probe_driver_jvm_pid(spark):
    pid = internals.driver_jvm_pid(spark)
    assert pid is None or "java" in " ".join(command_line(pid))


def probe_observation_ready(spark):
    observation = Observation("probe_ready")
    frame = _frame(spark).observe(observation, F.count(F.lit(1)).alias("n"))
    assert not internals.observation_ready(observation)
    frame.collect()
    assert internals.observation_ready(observation) and observation.get["n"] == 2


def probe_warm_up_kafka_clients(spark):
    # no Kafka answers on port 1: the clients load and give up within their time limits, raising nothing
    internals.warm_up_kafka_clients(spark, {"bootstrap.servers": "127.0.0.1:1", "request.timeout.ms": "1000"},
                                    [], "nothing", "skyfilter-probe")


def probe_task_conf_state(spark):
    active, served = internals.task_conf_state(spark)
    assert active, "the TaskConf plugin found no SQLConf.existingConf: tasks build a configuration per field"
    _frame(spark).repartition(2).write.format("noop").mode("overwrite").save()
    assert internals.task_conf_state(spark)[1] >= served + 2  # every task of the job started with its conf


def probe_avro_schema_of(spark):
    struct = _frame(spark).select(F.struct("alert_id", "band").alias("s")).schema[0].dataType
    schema = internals.avro_schema_of(spark, struct.json(), "probe", "skyfilter.test")
    assert schema["name"] == "probe" and [f["name"] for f in schema["fields"]] == ["alert_id", "band"]


def probe_parse_sql_expression(spark):
    tree = internals.parse_sql_expression(spark, "snr > 5 AND")
    assert tree.kind == "Alias" and tree.name == "AND"


def probe_parse_sql_statement(spark):
    text = "SELECT band AS b, snr FROM alerts WHERE snr > 5"
    tree = internals.parse_sql_statement(spark, text)
    assert tree.kind == "Project" and tree.children[0].kind == "Filter"
    condition = tree.children[0].condition
    assert text[condition.start:condition.stop + 1] == "snr > 5"
    assert [item.kind for item in tree.items] == ["Alias", "UnresolvedAttribute"]
    alias = tree.items[0]
    assert alias.name == "b" and text[alias.children[0].start:alias.children[0].stop + 1] == "band"


def probe_unresolved_column_names(spark):
    assert internals.unresolved_column_names(spark, "diaSource.snr > 5 AND band = 'g'") == ["diaSource.snr", "band"]


def probe_analyzed_plan_nodes(spark):
    nodes = internals.analyzed_plan_nodes(_frame(spark).where("snr > 5"))
    assert nodes[0]["class"].endswith(".Filter") and nodes[0]["num-children"] == 1


def probe_nondeterministic_expressions(spark):
    frame = _frame(spark)
    assert internals.nondeterministic_expressions(frame.where("snr > 5"), 1) == []
    assert internals.nondeterministic_expressions(frame.where("rand() > 0.5"), 1) == ["(rand() > 0.5D)"] or \
        "rand" in internals.nondeterministic_expressions(frame.where("rand() > 0.5"), 1)[0]


def probe_referenced_columns(spark):
    assert internals.referenced_columns(_frame(spark), "snr > 5 AND band <> 'g'") == {"snr", "band"}


def probe_optimized_plan(spark):
    assert "Filter" in internals.optimized_plan(_frame(spark).where("snr > 5"))


def probe_executed_plan(spark):
    assert "Filter" in internals.executed_plan(_frame(spark).where("snr > 5"))


def probe_observed_columns(spark):
    observed = _frame(spark).select("alert_id", "snr").observe("probe", F.max("snr"))
    assert internals.observed_columns(observed) == ["alert_id", "snr"]


def probe_compiled_classes(spark):
    assert internals.compiled_classes(spark) >= 0


def probe_job_descriptions(spark):
    spark.sparkContext.setJobDescription("skyfilter probe job")
    try:
        _frame(spark).collect()
    finally:
        spark.sparkContext.setJobDescription(None)
    assert "skyfilter probe job" in internals.job_descriptions(spark)


def probe_write_checkpoint_files(spark, tmp_path):
    internals.write_checkpoint_files(spark, tmp_path.as_uri(), ["0", "1"], b"v1\n{}\n")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["0", "1"]


def probe_jvm_steps(spark):
    calls = internals.jvm_steps(spark, [("withColumns", ({"twice": F.col("snr") * 2},)), ("drop", ("band",))])
    assert [method for method, _ in calls] == ["withColumns", "drop"]


def probe_apply_jvm_steps(spark):
    observation = Observation("probe_steps")
    calls = internals.jvm_steps(spark, [("select", (F.col("snr"),)), ("observe", (F.sum("snr").alias("total"),))])
    frame = internals.apply_jvm_steps(_frame(spark), calls, observation)
    assert [row.snr for row in frame.collect()] == [7.0, 70.0] and observation.get["total"] == 77.0


def probe_visit_cap_functions(spark, tmp_path):
    ledger = str(tmp_path / "caps.ledger")
    internals.register_jvm_function(spark, "VisitCapLedger")
    assert internals.open_visit_caps(spark, "probe", ledger, 48) == 0
    frame = spark.createDataFrame([("b", "n", 7, str(i)) for i in range(5)], "broker string, night string, "
                                                                              "visit long, alert_id string")
    admitted = frame.select(F.call_function(VISIT_CAP_FUNCTION, F.lit("probe"), "broker", "night", "visit",
                                            "alert_id", F.lit(3)).alias("kept")).collect()
    assert sum(row.kept for row in admitted) == 3
    assert internals.visit_cap_counts(spark, "probe") == [("n", 7, "b", 5, 3)]
    # What an executor's task asks the driver over TCP: the same answers, and a new alert refused at the cap.
    address = internals.serve_visit_caps(spark, "probe", "127.0.0.1")
    host_port, token = address.split("@")[1].split("/")
    requests = "".join(f"probe\tb\tn\t7\t{alert}\t3\n" for alert in ("0", "1", "2", "3", "4", "9"))
    with socket.create_connection((host_port.split(":")[0], int(host_port.split(":")[1])), timeout=10) as task:
        task.sendall(f"{token}\n{requests}else\tb\tn\t7\t0\t3\n".encode())
        reader = task.makefile()
        replies = [reader.readline() for _ in range(7)]
    assert replies[:5] == [("1\n" if row.kept else "0\n") for row in admitted] and replies[5] == "0\n"
    assert replies[6].startswith("eno open visit cap ledger 'else'")
    assert internals.visit_cap_counts(spark, "probe") == [("n", 7, "b", 1, 0)]
    internals.close_visit_caps(spark, "probe")
    assert internals.open_visit_caps(spark, "probe", ledger, 48) == 3  # read back from its file
    internals.close_visit_caps(spark, "probe")


def probe_python_filter_functions(spark):
    import pyarrow as pa

    internals.register_jvm_function(spark, "PythonFilterCall")
    assert "skyfilter_python_filters" in [f.name for f in spark.catalog.listFunctions() if f.name.startswith("sky")]
    schema = pa.ipc.read_schema(pa.py_buffer(internals.arrow_schema_of(_frame(spark).schema)))
    assert [(f.name, str(f.type)) for f in schema] == [("alert_id", "int64"), ("band", "string"), ("snr", "double")]


def probe_submitted_master(spark, monkeypatch):
    assert internals.submitted_master() is None, "not under spark-submit"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # this session's gateway is open already: the JVM answers
    assert internals.submitted_master() == spark.sparkContext.master


def probe_read_marks(spark):
    reader = f"probe-{uuid.uuid4().hex[:6]}"
    internals.register_jvm_function(spark, "ReadMarks")
    frame = spark.createDataFrame([(0, 5, 1000), (0, 7, 1200), (1, 3, 900), (0, 6, 1100)],
                                  "partition int, offset long, timestamp_ms long")
    kept = frame.where(F.call_function(internals.READ_MARK_FUNCTION, F.lit(reader), F.lit("alerts"), "partition",
                                       "offset", "timestamp_ms")).count()
    assert kept == 4  # every row kept
    assert internals.read_marks(spark, reader) == {("alerts", 0): (8, 1200, 3), ("alerts", 1): (4, 900, 1)}


def probe_serve_read_marks(spark):
    """What an executor sends (``ReadMarks.java``): a datagram of its marks, under the driver's token."""
    import socket
    import time

    suffix = internals.serve_read_marks(spark, "127.0.0.1")
    assert internals.serve_read_marks(spark, "127.0.0.1") == suffix, "one listener per driver JVM"
    port, token = suffix.split(":")[1].split("/")
    reader = f"probe-{uuid.uuid4().hex[:6]}{suffix}"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for sender, lines in (("1@a", [(0, 8, 1200, 3), (1, 4, 900, 1)]), ("2@b", [(0, 6, 1100, 2)]),
                              ("1@a", [(0, 9, 1300, 4)])):
            body = "".join(f"{reader}\talerts\t{p}\t{n}\t{t}\t{r}\n" for p, n, t, r in lines)
            udp.sendto(f"{token}\n{sender}\n{body}".encode(), ("127.0.0.1", int(port)))
            time.sleep(0.2)
        udp.sendto(f"wrong\n3@c\n{reader}\talerts\t1\t99\t9\t99\n".encode(), ("127.0.0.1", int(port)))
    deadline = time.monotonic() + 5
    while internals.read_marks(spark, reader).get(("alerts", 0), (0,))[0] != 9 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    assert internals.read_marks(spark, reader) == {("alerts", 0): (9, 1300, 6), ("alerts", 1): (4, 900, 1)}, \
        "furthest offset, rows summed over executors (each one's latest count), another driver's token ignored"


def probe_jvm_functions(spark, tmp_path):
    probe_visit_cap_functions(spark, tmp_path)
    probe_python_filter_functions(spark)
    probe_read_marks(spark)


def probe_template(spark):
    rows = _frame(spark)
    built = rows.withColumn("batch", F.lit("1")).where("snr > 5")
    template = PlanTemplate.of(built, rows, ("batch",))
    assert template is not None
    replayed, _ = template.apply(spark.createDataFrame([(3, "c", 9.0)], rows.schema), {"batch": "2"})
    assert [tuple(r) for r in replayed.collect()] == [(3, "c", 9.0, "2")]


def probe_pass_stop_signals_to(spark):
    import subprocess

    stand_in = subprocess.Popen(["sleep", "60"])  # the Python job a spark-submit JVM would pass SIGTERM on to
    try:
        assert "SIGTERM" in internals.pass_stop_signals_to(spark, stand_in.pid).split(",")
    finally:
        stand_in.kill()
        stand_in.wait()


def probe_announce_query_stop(spark):
    """A stopped query's write abort, logged on its own thread, reaches the log file at DEBUG and not the console."""
    from skyfilter.spark.session import SPARK_LOG

    run_id, marker = str(uuid.uuid4()), f"Data source write support probe-{uuid.uuid4()} is aborting."
    internals.announce_query_stop(spark, run_id)
    jvm = spark.sparkContext._jvm
    thread = jvm.java.lang.Thread.currentThread()
    name = thread.getName()
    thread.setName(f"stream execution thread for probe [id = x, runId = {run_id}]")
    try:
        jvm.org.apache.logging.log4j.LogManager.getLogger(
            "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec").error(marker)
    finally:
        thread.setName(name)
    logged = [line for line in SPARK_LOG.read_text().splitlines() if marker in line]
    assert logged and logged[0].split()[2] == "DEBUG", logged


PROBES = {
    "active_context": probe_active_context, "driver_jvm_pid": probe_driver_jvm_pid,
    "observation_ready": probe_observation_ready, "warm_up_kafka_clients": probe_warm_up_kafka_clients,
    "avro_schema_of": probe_avro_schema_of, "parse_sql_expression": probe_parse_sql_expression,
    "parse_sql_statement": probe_parse_sql_statement, "unresolved_column_names": probe_unresolved_column_names,
    "analyzed_plan_nodes": probe_analyzed_plan_nodes,
    "nondeterministic_expressions": probe_nondeterministic_expressions,
    "referenced_columns": probe_referenced_columns, "optimized_plan": probe_optimized_plan,
    "executed_plan": probe_executed_plan, "observed_columns": probe_observed_columns,
    "compiled_classes": probe_compiled_classes, "job_descriptions": probe_job_descriptions,
    "write_checkpoint_files": probe_write_checkpoint_files, "jvm_steps": probe_jvm_steps,
    "apply_jvm_steps": probe_apply_jvm_steps,
    "register_jvm_function": probe_jvm_functions, "open_visit_caps": probe_visit_cap_functions,
    "visit_cap_counts": probe_visit_cap_functions, "serve_visit_caps": probe_visit_cap_functions,
    "close_visit_caps": probe_visit_cap_functions,
    "arrow_schema_of": probe_python_filter_functions,
    "PlanTemplate.of": probe_template, "PlanTemplate.apply": probe_template,
    "pass_stop_signals_to": probe_pass_stop_signals_to, "announce_query_stop": probe_announce_query_stop,
    "task_conf_state": probe_task_conf_state,
    "read_marks": probe_read_marks, "submitted_master": probe_submitted_master,
    "serve_read_marks": probe_serve_read_marks,
}


def test_every_private_call_has_a_probe_and_a_reason():
    assert set(INTERNALS) == set(PROBES), "a function of spark/internals.py without a probe here, or the reverse"
    assert all(len(why) > 30 for why in INTERNALS.values())


@pytest.mark.parametrize("probe", sorted(set(PROBES.values()), key=lambda p: p.__name__),
                         ids=lambda p: p.__name__[len("probe_"):])
def test_each_private_call_works_on_the_pinned_spark(spark, tmp_path, monkeypatch, probe):
    arguments = {"spark": spark, "tmp_path": tmp_path, "monkeypatch": monkeypatch}
    probe(*[arguments[name] for name in probe.__code__.co_varnames[:probe.__code__.co_argcount]])


def test_a_broken_private_call_is_one_line_naming_it_and_its_reason(spark):
    @internal("it is a probe of the error message")
    def gone(session):
        return session.sparkContext._jvm.org.apache.spark.NoSuchThing.call()

    try:
        with pytest.raises(SparkInternalsError) as raised:
            gone(spark)
        message = str(raised.value)
        assert "internals.test_a_broken" in message and "gone" in message and "Spark 4." in message
        assert "it is a probe of the error message" in message and "\n" not in message
    finally:
        INTERNALS.pop(next(name for name in INTERNALS if name.endswith("gone")))

