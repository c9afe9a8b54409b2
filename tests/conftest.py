"""Shared test fixtures: one real Kafka broker (KRaft) and one local SparkSession per test session."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import fastavro
import psutil
import pytest
from confluent_kafka import DeserializingConsumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer

from skyfilter.core.config import Config
from skyfilter.core.log import captured
from skyfilter.local.kafka import LocalKafka, free_port_pair
from skyfilter.schemas.avro import rubin_schema
from skyfilter.schemas.wire import unframe

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `bench` imports in xdist workers too, which do not start in the checkout
    sys.path.insert(0, str(ROOT))
# The Spark driver JVMs a test starts (spark-submit's, a stream job's and its archive process) live seconds to a
# minute: they compile with the JVM's first tier only, whose work on 2 cores was CPU the suite waited for
# (tests/test_stops.py: 307 -> 192 core-seconds), in a code cache large enough never to fill (a full cache stops
# compiling).  The session's own SparkSession lives the whole run and keeps the full compiler (see `spark`).  What
# runs is unchanged; the demo and the benchmarks keep the JVM's defaults.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)
# Tests that use these fixtures run real Kafka or Spark: the full suite (`make test`) only.
REAL_COMPONENTS = {"kafka_cfg", "spark", "registry_url"}
# `make test` runs the suite in two pytest-xdist workers (each with its own Kafka broker and SparkSession): a
# test spends most of its time waiting for streams, and the other worker's test uses the cores meanwhile.
# This worker's number (0 when pytest runs alone).
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
# Files that run on one worker, one after the other: each group shares something beyond a file (the
# standalone cluster and its executors' filter workers; the fault table).  Then the groups that start first,
# longest first, so the two workers finish together.
TOGETHER = {"faults": ("test_archive_lane", "test_faults", "test_kill_restart"),
            "standalone-cluster": ("test_realtime_cluster", "test_spark_cluster")}
FIRST = ("faults", "test_bench", "standalone-cluster", "test_realtime", "test_docs_run", "test_stops",
         "test_schema_versions", "test_watchlists", "test_demo", "test_nights", "test_schema_evolution",
         "test_operations_live")


def port_base(base: int) -> int:
    """Where this worker starts looking for a free port: the workers search disjoint ranges (``free_port``
    looks 500 ports on), so two never choose the same free port before either listens on it."""
    return base + 1000 * WORKER


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: needs real Kafka, Spark or Delta (left out by `make test-fast`)")


def _group(item) -> str:
    module = item.module.__name__.rsplit(".", 1)[-1]
    return next((group for group, modules in TOGETHER.items() if module in modules), module)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses a real component as slow, so ``-m "not slow"`` is the fast tier; give each
    test its xdist group (its file's, or its files' group in ``TOGETHER``), the long groups first."""
    for item in items:
        if REAL_COMPONENTS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    order = {group: rank for rank, group in enumerate(FIRST)}
    items.sort(key=lambda item: order.get(_group(item), len(order)))  # stable: a file's own order is kept
DATA = ROOT / "samples"  # real public alerts (samples/README.md)
# a Python filter several tests use: alerts whose difference flux is negative
NEGATIVE_PY = '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.psfFlux"])
def negative(flux):
    return flux < 0
'''


@pytest.fixture(scope="session")
def kafka_cfg(tmp_path_factory) -> Config:
    """A config whose state lives in a temporary folder, with a running single-node Kafka."""
    cfg = Config.load(ROOT / "conf" / "local.yaml")
    cfg = cfg.with_values({"state_dir": str(tmp_path_factory.mktemp("state")),
                           "kafka.base_port": free_port_pair(port_base(19092)), "kafka.heap": "512m",
                           "monitoring.port": port_base(9464), "monitoring.archive_port": port_base(9465),
                           "topics.alerts_partitions": 3,
                           "simulation.schema_version": "10.0"})  # the tests decode what they produce with this one
    cluster = LocalKafka(cfg)
    cfg = cfg.with_values({"kafka.bootstrap_servers": cluster.start()})
    yield cfg
    cluster.stop()


@pytest.fixture(scope="session")
def registry_url(kafka_cfg) -> str:
    """The embedded registry served over Confluent's REST API (what `skyfilter registry serve` runs)."""
    from skyfilter.registry.server import RegistryServer

    server = RegistryServer(kafka_cfg, port=0).start()
    yield server.url
    server.stop()


FAULT_COLUMNS = [("fault", "fault"), ("produced", "alerts produced"), ("archived", "archived (distinct)"),
                 ("archive_rows", "archive rows"), ("expected", "matches expected"),
                 ("delivered", "delivered (distinct)"), ("duplicated", "duplicate deliveries"), ("lost", "lost")]


@pytest.fixture(scope="session")
def fault_report():
    """Rows of the fault-injection tests; written to .local/reports/faults.{json,md} for the README table."""
    rows: list[dict] = []
    yield rows
    if rows:
        from bench.report import markdown_table

        folder = ROOT / ".local" / "reports"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "faults.json").write_text(json.dumps(rows, indent=2))
        (folder / "faults.md").write_text(markdown_table(rows, FAULT_COLUMNS) + "\n")


def fault_row(fault: str, produced: int, alerts, delivered: list[str], expected: set[str]) -> dict:
    """One line of the fault table from the archive (a Delta DataFrame) and a broker topic's alert ids."""
    archived = alerts.select("alert_id").distinct().count()
    lost_alerts = produced - archived
    lost_matches = len(expected - set(delivered))
    return {"fault": fault, "produced": produced, "archived": archived, "archive_rows": alerts.count(),
            "expected": len(expected), "delivered": len(set(delivered)),
            "duplicated": len(delivered) - len(set(delivered)), "lost": lost_alerts + lost_matches}


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session (local[2], no UI).  Its JVM runs every in-process test for the
    whole session, so it compiles with both tiers (a run of the schema-version tests: 169 s, first tier only 201 s)."""
    from skyfilter.spark.session import get_spark

    short_lived = os.environ.get("SPARK_SUBMIT_OPTS") == SHORT_LIVED_JVM and os.environ.pop("SPARK_SUBMIT_OPTS")
    try:
        session = get_spark("skyfilter-tests", conf={"spark.ui.enabled": "false",
                                                     "spark.sql.shuffle.partitions": "2"})
    finally:
        if short_lived:
            os.environ["SPARK_SUBMIT_OPTS"] = short_lived
    yield session
    session.stop()


# For streams whose archive's own process is not what a test is about (in-process ones, the benchmarks'): the
# archive lane in the session's driver (one JVM, not two per stream) on 1 s triggers, so an idle stop need not wait
# for its 10 s and 30 s defaults.  Streams an operator would run (faults, kills, stops, Real-time Mode end to end)
# keep the default; the schema-evolution night runs it in the driver, beside Real-time Mode, a combination tested
# nowhere else.
ARCHIVE_IN_THE_DRIVER = ["--archive-trigger", "1s", "--set", "archive.log_trigger=1s", "--set", "archive.process=same"]


def stream_args(cfg: Config, topic: str, filters_dir: Path, brokers: Path, name: str | None = None,
                extra: list[str] | None = None) -> argparse.Namespace:
    """Arguments of pipelines/filter_stream.py in the test state dir (--available-now unless a trigger is given)."""
    from skyfilter.jobs.filter_stream import parse_args

    argv = ["--topic", topic, "--filters-dir", str(filters_dir), "--brokers", str(brokers),
            "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir)]
    if "--trigger" not in (extra or []):
        argv.append("--available-now")
    if name:
        argv += ["--name", name]
    return parse_args(argv + (extra or []))


def saying(lines: list[str]):
    """A block inside which what skyfilter logs (any thread) is appended to ``lines``."""
    return captured(lines)


def run_saying(lines: list[str], work: Callable[[], T]) -> T:
    """``work()``, with what skyfilter logs meanwhile (any thread) appended to ``lines``."""
    with captured(lines):
        return work()


def decode_messages(messages, schema: dict) -> list[dict]:
    """Decode wire-format messages with fastavro (independently of Spark)."""
    parsed = fastavro.parse_schema(schema)
    return [fastavro.schemaless_reader(io.BytesIO(unframe(m.value)[1]), parsed, None) for m in messages]


@contextlib.contextmanager
def standalone_cluster(cfg: Config, folder: Path, worker_cores: int | None = None):
    """A Spark standalone cluster on this machine (master + 2 workers, ``worker_cores`` each), stopped by pid."""
    from skyfilter.local.spark_cluster import cluster_on_free_ports

    with cluster_on_free_ports(cfg, folder / "cluster-state", worker_cores) as cluster:
        yield cluster
    assert len(cluster.last_stopped) == 3, "the master and both workers were stopped by pid"


@pytest.fixture(scope="session")
def spark_standalone(kafka_cfg, tmp_path_factory):
    """The test session's one Spark standalone cluster (master + 2 workers of 3 cores: Real-time Mode's 3
    long-lived tasks still fit once a worker is lost), started when a test first asks for it."""
    with standalone_cluster(kafka_cfg, tmp_path_factory.mktemp("standalone"), worker_cores=3) as cluster:
        yield cluster


def stream_folder(folder: Path, filters: dict[str, str], brokers: str) -> Path:
    """``folder`` with a stream's inputs: ``filters/`` (file name -> text) and ``brokers.yaml``."""
    write_files(folder / "filters", filters)
    (folder / "brokers.yaml").write_text(brokers)
    return folder


def write_files(folder: Path, files: dict[str, str]) -> Path:
    """Create a folder of small text files (filters, brokers.yaml)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def expected_deliveries(records_by_id: dict[str, dict], brokers: dict[str, list[tuple[str, object]]]) -> dict:
    """Per broker: alert id -> comma-joined names of its filters that the plain-Python predicates accept."""
    expected = {}
    for broker, filters in brokers.items():
        expected[broker] = {}
        for alert_id, record in records_by_id.items():
            names = [name for name, predicate in filters if predicate(record)]
            if names:
                expected[broker][alert_id] = ",".join(names)
    return expected


def check_topic(messages, expected: dict[str, str], inputs_by_id: dict, full: bool) -> None:
    """A broker topic holds each expected alert exactly once, with its filters header and input key/bytes."""
    ids = [m.headers["alert_id"] for m in messages]
    assert sorted(ids) == sorted(expected), "delivered alert ids differ from the independent evaluation"
    for message in messages:
        alert_id = message.headers["alert_id"]
        assert message.headers["filters"] == expected[alert_id]
        assert message.key == inputs_by_id[alert_id].key
        assert int(message.headers["input_time"]) == inputs_by_id[alert_id].timestamp_ms
        if full:
            assert message.value == inputs_by_id[alert_id].value


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on."""
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def kafka_status_ports(output: str) -> dict[int, tuple[int, int]]:
    """Node id -> (client port, controller port) as `skyfilter kafka status` prints them."""
    found = re.findall(r"^node (\d+): running \(pid \d+\), client port (\d+), controller port (\d+)", output, re.M)
    return {int(node): (int(client), int(controller)) for node, client, controller in found}


def consume_avro(kafka_cfg, registry_url: str, topic: str, count: int, timeout_s: float = 30.0) -> list:
    """``count`` values of a topic decoded by confluent-kafka's AvroDeserializer (what community brokers run)."""
    consumer = DeserializingConsumer({
        "bootstrap.servers": kafka_cfg.bootstrap_servers, "group.id": f"test-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "value.deserializer": AvroDeserializer(SchemaRegistryClient({"url": registry_url}))})
    consumer.subscribe([topic])
    values, deadline = [], time.time() + timeout_s
    try:
        while len(values) < count and time.time() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values



def stream_process(cfg: Config, topic: str, folder: Path, extra: list[str], submit: bool = False
                   ) -> tuple[subprocess.Popen, list[str]]:
    """``filter_stream.py`` as an operator runs it (filters and brokers.yaml in ``folder``), once it says
    ``running:``; its output lines keep coming into the returned list.  ``submit``: through ``spark-submit
    --master local[2]``, in a process group of its own (signals reach only what the test sends them to)."""
    launcher = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]"] if submit else \
        [sys.executable]
    command = [*launcher, str(ROOT / "pipelines" / "filter_stream.py"), "--topic", topic,
               "--filters-dir", str(folder / "filters"), "--brokers", str(folder / "brokers.yaml"),
               "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir), *extra]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=submit)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in job.stdout), daemon=True).start()
    deadline = time.time() + 240
    while not any("running: " in line for line in lines):
        assert job.poll() is None and time.time() < deadline, "\n".join(lines[-20:])
        time.sleep(0.5)
    return job, lines


def rewrite_as_ztf_402(path: Path, target: Path) -> dict:
    """Write the real ZTF 3.3 alert of container file ``path`` as ZTF 4.02 (no 4.x alerts are published: Avro
    resolution reads the 3.3 alert with the 4.02 schema) to ``target``; returns the 3.3 record."""
    schema = json.loads((DATA / "ztf-4.02" / "alert.avsc").read_text())
    with open(path, "rb") as handle:
        reader = fastavro.reader(handle, reader_schema=schema)
        alerts = list(reader)
    with open(target, "wb") as handle:
        fastavro.writer(handle, fastavro.parse_schema(schema), alerts)
    with open(path, "rb") as handle:
        return next(iter(fastavro.reader(handle)))


def snr_as_string() -> dict:
    """Rubin 11.1 with ``diaSource.snr`` turned into a string: a version no reader of real 11.1 data can read."""
    bad = copy.deepcopy(rubin_schema("11.1"))
    source = next(f["type"] for f in bad["fields"] if f["name"] == "diaSource")
    record = source if isinstance(source, dict) else next(b for b in source if isinstance(b, dict))
    next(f for f in record["fields"] if f["name"] == "snr")["type"] = ["null", "string"]
    return bad
