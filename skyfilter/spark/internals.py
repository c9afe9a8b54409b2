"""Every call skyfilter makes into Spark's private API (py4j objects, ``_jdf``, Catalyst plans), in one place.

PySpark's public API covers what a stream does; a few things skyfilter needs
it does not (a plan analysed once and replayed, the Avro schema ``to_avro``
writes, a SQL filter's own parse tree...).  Each such call lives here, behind a
function registered with :func:`internal` and the one line saying why no public
API serves.  An upgrade that removes or renames what one of them uses makes it
raise :class:`SparkInternalsError`, naming the function and the reason, and
``tests/test_spark_internals.py`` runs every registered function on a real
session, so an upgrade that breaks one fails there first, with that message.

    >>> plan_text = optimized_plan(frame)           # what a test checks: one from_avro
    >>> names = referenced_columns(frame, "diaSource.snr > 5")
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import SparkContext
from pyspark.sql import DataFrame, Observation, SparkSession

from skyfilter.core.errors import SkyfilterError

INTERNALS: dict[str, str] = {}  # function name -> why no public API serves


class SparkInternalsError(SkyfilterError):
    """Spark no longer has a private API skyfilter relies on (an upgrade changed it)."""


def internal(why: str):
    """Register a function as a user of Spark's private API, with ``why`` no public API serves.

    A missing JVM class (py4j then calls a ``JavaPackage``), method or Python attribute
    becomes one :class:`SparkInternalsError` line; an exception the JVM threw passes as it is.
    """
    def wrap(function):
        INTERNALS[function.__qualname__] = why

        @functools.wraps(function)
        def checked(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except Py4JJavaError:
                raise
            except (Py4JError, AttributeError, ImportError, TypeError) as exc:
                if isinstance(exc, TypeError) and "JavaPackage" not in str(exc):  # a JVM class that is gone
                    raise
                from pyspark import __version__

                raise SparkInternalsError(
                    f"internals.{function.__qualname__}: Spark {__version__} no longer has what it uses "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); it is needed because "
                    f"{why} (skyfilter/spark/internals.py)") from exc
        return checked
    return wrap


def _jvm(spark: SparkSession):
    return spark.sparkContext._jvm


# ----------------------------------------------------------------------------------------------- the session
@internal("PySpark has no public handle on the context the process runs, only on the active session of a thread")
def active_context() -> SparkContext | None:
    """The process's running SparkContext, if any (whichever thread started it)."""
    return SparkContext._active_spark_context


@internal("PySpark exposes no pid of the JVM it launched")
def driver_jvm_pid(spark: SparkSession) -> int | None:
    """Pid of the local Spark driver JVM (None when PySpark did not launch it)."""
    process = getattr(spark.sparkContext._gateway, "proc", None)
    return process.pid if process is not None else None


@internal("PySpark has no way to ask whether an Observation has its figures without blocking until it does")
def observation_ready(observation: Observation) -> bool:
    """Whether ``observation`` has its figures (its DataFrame ran an action that completed it)."""
    return observation._jo is not None and observation._jo.future().isCompleted()


# ----------------------------------------------------------------------------------------------- Kafka
@internal("Spark opens its Kafka clients inside tasks and keeps its producers in a private pool; the pooled "
          "producer the sink will use is reached through that pool")
def warm_up_kafka_clients(spark: SparkSession, settings: dict[str, str], output_topics: Sequence[str],
                          input_topic: str, client_id: str) -> None:
    """Open the producer the Kafka sink of this JVM will use and fetch the output topics' metadata into it, and
    load the consumer classes, sending nothing.

    ``settings`` are the sink's Kafka settings (without Spark's ``kafka.`` prefix):
    Spark's pool hands its tasks the producer of exactly those settings plus its byte
    serializers, so they find the metadata of every topic already there instead of
    waiting for it topic by topic on their first records (0.5-1 s for 22 topics).  A
    consumer is assigned ``input_topic``'s partitions at their end and polls once:
    nothing is read and no offset moves.
    """
    jvm = _jvm(spark)

    def properties(extra: dict[str, str]):
        props = jvm.java.util.Properties()
        for key, value in {**settings, **extra}.items():
            props.setProperty(key, str(value))
        return props

    serializer = "org.apache.kafka.common.serialization.ByteArraySerializer"
    params = jvm.java.util.HashMap()
    for key, value in {**settings, "key.serializer": serializer, "value.serializer": serializer}.items():
        params.put(key, str(value))
    pool = getattr(getattr(jvm.org.apache.spark.sql.kafka010.producer, "InternalKafkaProducerPool$"), "MODULE$")
    pooled = pool.acquire(params)
    try:
        for topic in output_topics:
            try:
                pooled.producer().partitionsFor(topic)
            except Py4JJavaError:  # Kafka does not answer: the sink's own write says so, after its own wait
                break
    finally:
        pool.release(pooled)
    deserializer = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
    consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(properties(
        {"key.deserializer": deserializer, "value.deserializer": deserializer, "enable.auto.commit": "false",
         "allow.auto.create.topics": "false", "default.api.timeout.ms": "5000", "fetch.max.wait.ms": "10",
         "client.id": client_id}))
    try:
        partitions = jvm.java.util.ArrayList()
        for info in consumer.partitionsFor(input_topic) or []:
            partitions.add(jvm.org.apache.kafka.common.TopicPartition(input_topic, info.partition()))
        consumer.assign(partitions)
        consumer.seekToEnd(partitions)
        consumer.poll(jvm.java.time.Duration.ofMillis(100))
    except Py4JJavaError:
        pass  # the source's own read says what is wrong with the topic
    finally:
        consumer.close()


# ------------------------------------------------------------------------------- skyfilter's JVM functions
@internal("skyfilter's own SQL functions (spark/jvm/) are non-deterministic JVM UDFs: PySpark's registerJavaFunction "
          "registers deterministic ones only, so each class registers itself, reached by py4j")
def register_jvm_function(spark: SparkSession, java_class: str) -> None:
    """Register the SQL function of skyfilter's JVM class ``java_class`` (``VisitCapLedger``: the visit caps, whose
    ledgers are opened apart; ``PythonFilterCall``: the Python filter workers, alert by alert; ``ReadMarks``:
    where a query's tasks have read to)."""
    getattr(_jvm(spark).skyfilter, java_class).register(spark._jsparkSession)


@internal("spark-submit hands --master to its own JVM only; pyspark reads the JVM's settings once its gateway is "
          "open, which SparkContext._ensure_initialized does without creating a context (the job must settle its "
          "run, and so its session's settings, before the context exists)")
def submitted_master() -> str | None:
    """The master spark-submit was started with (None when this process was not started by spark-submit)."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf().get("spark.master", None)


# ----------------------------------------------------------------------------------------------- caps


@internal("Real-time Mode has no stateful operator: the caps' ledger is skyfilter's own JVM class, reached by py4j")
def open_visit_caps(spark: SparkSession, ledger: str, path: str, keep_hours: float) -> int:
    """Open the stream's ledger, kept in the file ``path`` (admissions younger than ``keep_hours``); the number of
    admissions read back from the file."""
    return _jvm(spark).skyfilter.VisitCapLedger.open(ledger, path, float(keep_hours))


@internal("Real-time Mode has no stateful operator: the caps' ledger is skyfilter's own JVM class, reached by py4j")
def serve_visit_caps(spark: SparkSession, ledger: str, host: str) -> str:
    """Serve the driver's open ledgers to executors over TCP (one server per driver JVM); the address of
    ``ledger`` as tasks on other machines reach it at ``host`` (the SQL function's first argument)."""
    return str(_jvm(spark).skyfilter.VisitCapLedger.serve(ledger, host))


@internal("Real-time Mode has no stateful operator: the caps' ledger is skyfilter's own JVM class, reached by py4j")
def visit_cap_counts(spark: SparkSession, ledger: str) -> list[tuple[str, int | None, str, int, int]]:
    """(night, visit, broker, matched, admitted) of the ledger's capped brokers since the last call."""
    counts = []
    for line in _jvm(spark).skyfilter.VisitCapLedger.drainCounts(ledger).splitlines():
        night, visit, broker, matched, admitted = line.split("\t")
        counts.append((night, int(visit) if visit else None, broker, int(matched), int(admitted)))
    return counts


@internal("Real-time Mode has no stateful operator: the caps' ledger is skyfilter's own JVM class, reached by py4j")
def close_visit_caps(spark: SparkSession, ledger: str) -> None:
    """Close the stream's ledger (its file stays, for the next start)."""
    _jvm(spark).skyfilter.VisitCapLedger.close(ledger)


READ_MARK_FUNCTION = "skyfilter_read_mark"  # skyfilter/spark/jvm/ReadMarks.java


@internal("a Real-time query reports its offsets only at checkpoints: where its tasks read to is noted by "
          "skyfilter's own JVM function and read back through py4j")
def read_marks(spark: SparkSession, reader: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (next offset, append time in ms of the last row read, rows read) of ``reader``."""
    marks = {}
    for line in _jvm(spark).skyfilter.ReadMarks.snapshot(reader).splitlines():
        topic, partition, next_offset, timestamp_ms, rows = line.split("\t")
        marks[(topic, int(partition))] = (int(next_offset), int(timestamp_ms), int(rows))
    return marks


@internal("a Real-time query reports its offsets only at checkpoints: on a cluster the executors' read marks "
          "reach the driver's JVM through skyfilter's own listener, started through py4j")
def serve_read_marks(spark: SparkSession, host: str) -> str:
    """Have the driver's JVM listen for the executors' read marks; the suffix (``@host:port/token``) of a
    reader's name whose marks the executors send to ``host``."""
    return str(_jvm(spark).skyfilter.ReadMarks.serve(host))


@internal("inside a task Spark 4.2 builds a SQL configuration per nested field it decodes; the thread-local that "
          "holds one per task is private to Spark, so skyfilter's plugin (spark/jvm/TaskConf.java) sets it")
def task_conf_state(spark: SparkSession) -> tuple[bool, int]:
    """(whether tasks of this JVM get their SQL configuration once, how many tasks got it so far)."""
    task_conf = _jvm(spark).skyfilter.TaskConf
    return bool(task_conf.active()), int(task_conf.tasksServed())


@internal("a stopped query's cancelled write logs ERROR lines that are no failure; Spark offers no way to tell "
          "its logging a stop was asked for, so skyfilter's own log policy is told through py4j")
def announce_query_stop(spark: SparkSession, run_id: str) -> None:
    """Tell skyfilter's log policy (``spark/jvm/ExpectedCancellations.java``) that the query of ``run_id`` is being
    stopped: its write's abort goes to the log file at debug level, not to the console."""
    _jvm(spark).skyfilter.ExpectedCancellations.queryStopping(run_id)


@internal("spark-submit's JVM exits at once on SIGTERM, taking the Python job with it; Spark offers no hook to "
          "pass a signal on, so skyfilter's own JVM class does")
def pass_stop_signals_to(spark: SparkSession, pid: int) -> str:
    """Have the driver JVM pass SIGTERM/SIGINT on to Python process ``pid`` (a second one ends both at once);
    returns the signals it now handles ("" when none)."""
    return str(_jvm(spark).skyfilter.StopSignals.install(pid))


@internal("PySpark converts Spark types to Arrow for its UDFs but does not expose the conversion publicly")
def arrow_schema_of(schema) -> bytes:
    """The Arrow schema (serialized) of a Spark struct type, as PySpark hands its columns to a pandas UDF."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    return pa.schema([pa.field(f.name, to_arrow_type(f.dataType), f.nullable) for f in schema.fields]) \
        .serialize().to_pybytes()


# ----------------------------------------------------------------------------------------------- Avro
@internal("PySpark can write Avro with to_avro but cannot show the schema it writes for a Spark type")
def avro_schema_of(spark: SparkSession, struct_json: str, record: str, namespace: str) -> dict:
    """The Avro record schema ``to_avro`` writes for a Spark struct type (given as its JSON)."""
    data_type = spark._jsparkSession.parseDataType(struct_json)
    avro = _jvm(spark).org.apache.spark.sql.avro.SchemaConverters.toAvroType(data_type, False, record, namespace)
    return json.loads(avro.toString())


# ----------------------------------------------------------------------------------------------- SQL filters
@dataclass(frozen=True)
class SqlTree:
    """A node of Spark's parse tree of a SQL filter, as plain data (what the filter checks read of it)."""

    kind: str                           # Catalyst's node name: Project, Filter, Alias, UnresolvedStar...
    sql: str = ""                       # Spark's own rendering of the node
    start: int | None = None            # its first and last character in the filter's text
    stop: int | None = None
    name: str | None = None             # an Alias's name
    children: tuple[SqlTree, ...] = ()  # plan nodes: their children; an Alias: what it names
    condition: SqlTree | None = None    # a Filter's condition
    items: tuple[SqlTree, ...] = ()     # a Project's list


def _sql_tree(node, depth: int, expression: bool) -> SqlTree:
    """``node`` (a plan node, or an ``expression``) as a :class:`SqlTree`, its children ``depth`` levels down."""
    kind = node.nodeName()
    origin = node.origin()
    start, stop = origin.startIndex(), origin.stopIndex()
    sql = ""
    if expression:
        with contextlib.suppress(Py4JJavaError):  # an unresolved node Spark cannot render
            sql = node.sql()
    children = ()
    if depth > 0:
        nodes = node.children()
        children = tuple(_sql_tree(nodes.apply(i), depth - 1, expression) for i in range(nodes.size()))
    condition = _sql_tree(node.condition(), 1, True) if kind == "Filter" and not expression else None
    items = ()
    if kind == "Project" and not expression:
        listed = node.projectList()
        items = tuple(_sql_tree(listed.apply(i), 1, True) for i in range(listed.size()))
    return SqlTree(kind, sql, start.get() if start.isDefined() else None, stop.get() if stop.isDefined() else None,
                   node.name() if kind == "Alias" else None, children, condition, items)


@internal("PySpark parses SQL only to run it; a filter's checks need its parse tree before anything runs")
def parse_sql_expression(spark: SparkSession, text: str) -> SqlTree:
    """Spark's parse of ``text`` as one expression (raises pyspark's ParseException)."""
    return _sql_tree(spark._jsparkSession.sessionState().sqlParser().parseExpression(text), 0, True)


@internal("PySpark parses SQL only to run it; a filter's checks need its parse tree before anything runs")
def parse_sql_statement(spark: SparkSession, text: str) -> SqlTree:
    """Spark's parse of ``text`` as one statement, two plan levels deep (raises pyspark's ParseException)."""
    return _sql_tree(spark._jsparkSession.sessionState().sqlParser().parsePlan(text), 1, False)


@internal("PySpark parses SQL only to run it; a filter's checks need its parse tree before anything runs")
def unresolved_column_names(spark: SparkSession, text: str) -> list[str]:
    """The dotted column names a SQL expression names, in order, before analysis."""
    nodes = json.loads(spark._jsparkSession.sessionState().sqlParser().parseExpression(text).toJSON())
    return [node["nameParts"].strip("[]").replace(", ", ".") for node in nodes
            if node["class"].endswith("UnresolvedAttribute")]


@internal("DataFrame.explain prints text; a filter's checks need the analysed plan's nodes and expressions")
def analyzed_plan_nodes(frame: DataFrame) -> list[dict]:
    """The analysed plan of ``frame`` as Spark's JSON node list (pre-order, ``num-children`` per node)."""
    return json.loads(frame._jdf.queryExecution().analyzed().toJSON())


@internal("DataFrame.explain prints text; a filter's checks need to know which expressions are deterministic")
def nondeterministic_expressions(frame: DataFrame, depth: int) -> list[str]:
    """The SQL of every non-deterministic expression of the top ``depth`` nodes of ``frame``'s analysed plan
    (down its first children)."""
    node, found = frame._jdf.queryExecution().analyzed(), []
    for _ in range(depth):
        expressions = node.expressions()
        found += [expressions.apply(i).sql() for i in range(expressions.size())
                  if not expressions.apply(i).deterministic()]
        if node.children().size() != 1:
            break
        node = node.children().apply(0)
    return found


@internal("PySpark has no public way to list the columns an expression reads")
def referenced_columns(frame: DataFrame, condition: str) -> set[str]:
    """The top-level columns of ``frame`` that the SQL ``condition`` reads."""
    from pyspark.sql import functions as F

    references = frame.select(F.expr(condition))._jdf.queryExecution().analyzed().references().iterator()
    names = set()
    while references.hasNext():
        names.add(references.next().name())
    return names


# ----------------------------------------------------------------------------------------------- plans
@internal("DataFrame.explain prints to the console; tests and checks need the optimised plan as text")
def optimized_plan(frame: DataFrame) -> str:
    """The optimised logical plan of ``frame``, as Spark prints it."""
    return frame._jdf.queryExecution().optimizedPlan().toString()


@internal("DataFrame.explain prints to the console; tests and checks need the physical plan as text")
def executed_plan(frame: DataFrame) -> str:
    """The physical plan of ``frame``, as Spark prints it."""
    return frame._jdf.queryExecution().executedPlan().toString()


@internal("an observe node's input columns show only in the optimised plan's tree, which PySpark does not expose")
def observed_columns(frame: DataFrame) -> list[str]:
    """The names of the columns the first ``observe`` of ``frame``'s optimised plan is given."""
    pending = [frame._jdf.queryExecution().optimizedPlan()]
    while pending:
        node = pending.pop(0)
        if node.nodeName() == "CollectMetrics":
            output = node.child().output()
            return [output.apply(i).name() for i in range(output.size())]
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    return []


@internal("Spark counts its generated classes in a metrics source PySpark does not expose")
def compiled_classes(spark: SparkSession) -> int:
    """How many classes Spark's code generator has compiled in this JVM."""
    return _jvm(spark).org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


@internal("PySpark's status tracker gives job ids and stages but not the job descriptions that name their query")
def job_descriptions(spark: SparkSession) -> list[str]:
    """The description of every job this Spark application ran (a streaming query's name its batch jobs)."""
    iterator = spark.sparkContext._jsc.sc().statusStore().jobsList(None).iterator()
    found = []
    while iterator.hasNext():
        job = iterator.next()
        found.append(job.description().get() if job.description().isDefined() else "")
    return found


@internal("the checkpoint file manager a stream writes with is chosen inside Spark; no public API opens one")
def write_checkpoint_files(spark: SparkSession, folder: str, names: Sequence[str], content: bytes) -> None:
    """Write one file per name in ``folder`` through the checkpoint file manager Spark's streams use."""
    jvm = _jvm(spark)
    path = jvm.org.apache.hadoop.fs.Path
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        path(folder), spark._jsparkSession.sessionState().newHadoopConf())
    for name in names:
        out = manager.createAtomic(path(f"{folder.rstrip('/')}/{name}"), False)
        out.write(bytearray(content))
        out.close()


# ----------------------------------------------------------------------------------------------- JVM steps
@internal("PySpark converts each Column list to a JVM sequence again at every call: the steps keep theirs")
def jvm_steps(spark: SparkSession, steps: Sequence[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, tuple]]:
    """Each step's method and its arguments as JVM objects, built once (see
    :class:`skyfilter.spark.steps.JvmSteps`)."""
    from pyspark.sql.classic.column import _to_java_column, _to_seq

    context = spark.sparkContext
    calls: list[tuple[str, tuple]] = []
    for method, arguments in steps:
        if method == "withColumns":
            if arguments[0]:
                calls.append((method, (_to_seq(context, list(arguments[0])),
                                       _to_seq(context, list(arguments[0].values()), _to_java_column))))
        elif method == "select":
            calls.append((method, (_to_seq(context, list(arguments), _to_java_column),)))
        elif method == "drop":
            calls.append((method, (_to_seq(context, list(arguments)),)))
        elif method == "observe":
            first, *rest = arguments
            calls.append((method, (first._jc, _to_seq(context, [c._jc for c in rest]))))
        else:
            raise ValueError(f"unknown step {method}")
    return calls


@internal("PySpark converts each Column list to a JVM sequence again at every call: the steps keep theirs")
def apply_jvm_steps(frame: DataFrame, calls: list[tuple[str, tuple]], observation: Observation | None = None
                    ) -> DataFrame:
    """``frame`` with :func:`jvm_steps`' calls applied in order; an ``observe`` call fills ``observation``."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

    jdf = frame._jdf
    for method, arguments in calls:
        if method == "observe":  # what Observation._on does, with the figures' sequence built once
            jvm = frame.sparkSession.sparkContext._jvm
            observation._jvm = jvm
            observation._jo = getattr(jvm, "org.apache.spark.sql.Observation")(observation._name)
            jdf = jdf.observe(observation._jo, *arguments)
        else:
            jdf = getattr(jdf, method)(*arguments)
    return ClassicFrame(jdf, frame.sparkSession)
