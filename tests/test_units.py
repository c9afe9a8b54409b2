"""Unit tests of pure functions: wire format, config, filter loading, brokers, schemas, cutouts, simulator."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import fastavro
import numpy as np
import pandas as pd
import pytest
from astropy.io import fits

from conftest import DATA, ROOT, write_files
from skyfilter.core.alert_columns import detect
from skyfilter.core.brokers import load_brokers
from skyfilter.core.config import Config, parse_overrides
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import filter_function, load_filters
from skyfilter.filtering.filter_eval import as_verdict
from skyfilter.producers.simulate import AlertSimulator
from skyfilter.registry.client import ConfluentRegistry
from skyfilter.schemas.avro import (
    blank_value,
    cutout_fields,
    filled_record,
    fingerprint,
    read_container,
    rubin_schema,
    schemaless_body,
    without_fields,
)
from skyfilter.schemas.wire import WireFormatError, frame, unframe


def test_wire_format_round_trip_and_errors():
    message = frame(742901398, b"avro")
    assert message[:1] == b"\x00" and len(message) == 9
    assert unframe(message) == (742901398, b"avro")
    with pytest.raises(WireFormatError, match="magic byte is 1"):
        unframe(b"\x01\x00\x00\x00\x01x")
    with pytest.raises(WireFormatError, match="shorter"):
        unframe(b"\x00\x00")


def test_config_missing_key_names_key_and_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  heap: 1g\n")
    cfg = Config.load(path, parse_overrides(["kafka.nodes=3"]))
    assert (cfg.kafka.nodes, cfg.kafka.heap) == (3, "1g")
    assert cfg.kafka.bootstrap_servers == Config.load().kafka.bootstrap_servers, "the rest from the defaults"
    with pytest.raises(SkyfilterError, match=r"c.yaml: missing config key 'kafka.no_such_key'"):
        cfg.get("kafka.no_such_key")
    path.write_text("kafka: [unclosed\n")
    with pytest.raises(SkyfilterError, match=r"c.yaml:\d+: invalid YAML"):
        Config.load(path)


def test_shipped_config_has_every_key_the_tools_read():
    cfg = Config.load(ROOT / "conf" / "local.yaml")
    for key in ("state_dir", "kafka.bootstrap_servers", "kafka.libs_dir", "topics.alerts", "topics.alerts_partitions",
                "schema_registry.topic", "stream.trigger", "stream.night_offset_hours", "simulation.interval_s"):
        cfg.get(key)
    assert cfg.topics.alerts_partitions == 8
    assert cfg.kafka.max_message_bytes >= 10_000_000


def test_filter_loader_reports_file_line_and_reason(tmp_path):
    folder = write_files(tmp_path, {
        "good.sql": "-- comment\ndiaSource.snr > 5",
        "empty.sql": "-- only a comment\n",
        "syntax.py": "from skyfilter import alert_filter\n\n@alert_filter(columns=['a'])\ndef f(a)\n    return a\n",
        "crash.py": "x = 1\nraise RuntimeError('boom')\n",
        "none.py": "def f(a):\n    return a\n",
        "good.py.bak": "ignored",
    })
    specs, problems = load_filters(folder)
    assert [s.name for s in specs] == ["good"]
    found = {p.path.name: (p.line, p.reason) for p in problems}
    assert found["empty.sql"][1].startswith("empty filter")
    assert found["syntax.py"][0] == 4 and "syntax error" in found["syntax.py"][1]
    assert found["crash.py"] == (2, "import failed: RuntimeError: boom")
    assert "no function decorated" in found["none.py"][1]


def test_repository_filters_load():
    specs, problems = load_filters(ROOT / "filters")
    assert not problems
    assert {s.kind for s in specs} == {"sql", "python"}


def test_fast_riser_on_history_arrays_matches_its_definition():
    """The shipped Python filter, given history fields as arrays (as Spark passes them), against its meaning."""
    spec = next(s for s in load_filters(ROOT / "filters")[0] if s.name == "fast_riser")
    simulator = AlertSimulator(rubin_schema("10.0"), "2026-11-20", seed=3, stamps=False)
    alerts = [simulator.alert(simulator.visit(v), i) for v in range(4) for i in range(500)]
    alerts[0]["prvDiaSources"] = []
    alerts[1]["prvDiaSources"] = None
    alerts[2]["diaSource"]["psfFlux"], alerts[2]["prvDiaSources"] = 1000.0, [
        {**alerts[2]["diaSource"], "psfFlux": 300.0, "midpointMjdTai": alerts[2]["diaSource"]["midpointMjdTai"] - 1}]

    def expected(alert: dict) -> bool:
        now = alert["diaSource"]
        recent = [s["psfFlux"] for s in alert["prvDiaSources"] or []
                  if 0 < now["midpointMjdTai"] - s["midpointMjdTai"] < 5 and s["psfFlux"] and s["psfFlux"] > 0]
        return bool(recent) and now["psfFlux"] > 2.5 * max(recent)

    def history(field: str) -> pd.Series:
        return pd.Series([None if a["prvDiaSources"] is None else
                          np.array([s[field] for s in a["prvDiaSources"]], dtype=float) for a in alerts])

    verdicts = filter_function(spec)(pd.Series([a["diaSource"]["psfFlux"] for a in alerts], dtype=float),
                                     pd.Series([a["diaSource"]["midpointMjdTai"] for a in alerts]),
                                     history("psfFlux"), history("midpointMjdTai"))
    assert list(verdicts) == [expected(a) for a in alerts]
    assert verdicts[2] and 1 < sum(verdicts) < len(alerts)


def test_brokers_file_defaults_and_errors(tmp_path):
    path = tmp_path / "brokers.yaml"
    path.write_text("brokers:\n  a:\n    filters: [x]\n  b:\n    filters: y\n    format: nocutouts\n    topic: out.b\n")
    a, b = load_brokers(path)
    assert (a.topic, a.format, b.topic, b.format, b.filters) == ("filtered.a", "full", "out.b", "nocutouts", ("y",))
    assert (a.max_alerts_per_visit, b.max_alerts_per_visit) == (20, 20)
    path.write_text("max_alerts_per_visit: 50\nbrokers:\n  a:\n    filters: [x]\n    format: lite\n"
                    "  b:\n    filters: [y]\n    max_alerts_per_visit: null\n"
                    "  c:\n    filters: [z]\n    max_alerts_per_visit: 3\n")
    assert [(b.format, b.max_alerts_per_visit) for b in load_brokers(path)] == [("lite", 50), ("full", None),
                                                                                ("full", 3)]
    path.write_text("brokers:\n  a:\n    filters: [x]\n    format: tiny\n")
    with pytest.raises(SkyfilterError, match=r"brokers.yaml:3: broker 'a': format 'tiny' is not one of"):
        load_brokers(path)
    path.write_text("brokers:\n  a:\n    filters: [x]\n    max_alerts_per_visit: -1\n")
    with pytest.raises(SkyfilterError, match=r"brokers.yaml:3: broker 'a': max_alerts_per_visit must be"):
        load_brokers(path)
    assert {b.name for b in load_brokers(ROOT / "conf" / "brokers.yaml")} == {"transients", "galactic", "red_reliable",
                                                                        "summaries"}


def test_filter_verdicts_must_be_booleans_of_the_right_length():
    assert as_verdict(pd.Series([True, False]), 2).tolist() == [True, False]
    assert as_verdict(np.array([True, False]), 2).tolist() == [True, False]
    assert as_verdict(pd.Series([True, None], dtype=object), 2).isna().tolist() == [False, True]
    with pytest.raises(TypeError, match="returned 1 values for 2 alerts"):
        as_verdict(pd.Series([True]), 2)
    with pytest.raises(TypeError, match="returned float64 values, expected booleans"):
        as_verdict(pd.Series([0.5, 1.0]), 2)
    with pytest.raises(TypeError, match="expected a boolean Series"):
        as_verdict(True, 2)


def test_schema_families_and_nocutouts():
    rubin = rubin_schema("10.0")
    assert detect(rubin).family == "rubin" and detect(rubin).alert_id == "diaSourceId"
    assert cutout_fields(rubin) == ["cutoutDifference", "cutoutScience", "cutoutTemplate"]
    reduced = without_fields(rubin, cutout_fields(rubin))
    assert not cutout_fields(reduced) and fingerprint(reduced) != fingerprint(rubin)
    ztf_schema, _ = read_container(next((DATA / "ztf-3.3").glob("*.avro")))
    assert detect(ztf_schema).family == "ztf"
    with pytest.raises(SkyfilterError, match="not a known alert family"):
        detect({"type": "record", "name": "x", "fields": [{"name": "a", "type": "int"}]})


def test_filled_record_touches_every_field_of_rubin_and_ztf_schemas():
    """The warm-up alert: every nullable field present, every array one item long, and a valid encoding."""
    ztf_schema, _ = read_container(next((DATA / "ztf-3.3").glob("*.avro")))
    for schema in (rubin_schema("10.0"), ztf_schema):
        body = schemaless_body(schema, filled_record(schema))
        decoded = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema))
        assert schemaless_body(schema, decoded) == body  # (decoded has logical types: compare encodings)
    rubin = filled_record(rubin_schema("10.0"))
    assert rubin["diaObject"] is not None and len(rubin["prvDiaSources"]) == 1
    assert rubin["prvDiaSources"][0].keys() == rubin["diaSource"].keys()
    assert blank_value(rubin_schema("10.0"))["diaObject"] is None  # not filled: nullable fields stay null


def test_container_records_keep_their_exact_bytes():
    schema, records = read_container(DATA / "lsst-v10" / "fink-lsst-v10-7alerts.avro")
    records = list(records)
    with open(DATA / "lsst-v10" / "fink-lsst-v10-7alerts.avro", "rb") as handle:
        expected = list(fastavro.reader(handle))
    assert len(records) == 7
    parsed = fastavro.parse_schema(schema)
    for item, record in zip(records, expected, strict=True):  # records hold NaNs: compare encodings, not dicts
        assert item.record["diaSourceId"] == record["diaSourceId"]
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record)
        assert out.getvalue() == item.body


def test_simulated_alerts_are_valid_realistic_and_deterministic():
    schema = rubin_schema("10.0")
    simulator = AlertSimulator(schema, "2026-11-20", seed=3)
    visit = simulator.visit(0)
    alerts = [simulator.alert(visit, i) for i in range(200)]
    parsed = fastavro.parse_schema(schema)
    for alert in alerts[:20]:
        fastavro.schemaless_writer(io.BytesIO(), parsed, alert)  # raises if invalid
    snr = np.array([a["diaSource"]["snr"] for a in alerts])
    reliability = np.array([a["diaSource"]["reliability"] for a in alerts])
    assert 0.05 < (snr > 50).mean() < 0.4 and np.median(snr) < 30
    assert 0.2 < (reliability > 0.8).mean() < 0.6
    assert {a["diaSource"]["visit"] for a in alerts} == {visit.visit_id}
    assert len({a["diaSourceId"] for a in alerts}) == 200
    assert AlertSimulator(schema, "2026-11-20", seed=3).alert(visit, 5) == alerts[5]
    with fits.open(io.BytesIO(alerts[0]["cutoutScience"])) as hdus:
        assert hdus[0].data.shape == (100, 100)
        assert hdus[0].header["CTYPE1"] == "RA---TAN"
        assert abs(hdus[0].header["CRVAL1"] - alerts[0]["diaSource"]["ra"]) < 1e-6


class _FakeConfluent(BaseHTTPRequestHandler):
    """The three endpoints of the Confluent Schema Registry REST API the client uses."""

    schemas: dict[int, str] = {}
    subjects: dict[str, int] = {}

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        subject = self.path.split("/")[2]
        schema_id = next((i for i, s in self.schemas.items() if s == body["schema"]), len(self.schemas) + 1)
        self.schemas[schema_id] = body["schema"]
        self.subjects[subject] = schema_id
        self._send(200, {"id": schema_id})

    def do_GET(self):  # noqa: N802
        parts = self.path.strip("/").split("/")
        if parts[0] == "schemas" and int(parts[2]) in self.schemas:
            return self._send(200, {"schema": self.schemas[int(parts[2])]})
        if parts[0] == "subjects" and parts[1] in self.subjects:
            schema_id = self.subjects[parts[1]]
            return self._send(200, {"id": schema_id, "version": 1, "schema": self.schemas[schema_id]})
        self._send(404, {"error_code": 40401, "message": "not found"})

    def log_message(self, *args):
        pass


def test_confluent_registry_client_speaks_the_rest_api():
    server = HTTPServer(("127.0.0.1", 0), _FakeConfluent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        registry = ConfluentRegistry(f"http://127.0.0.1:{server.server_port}")
        assert registry.latest("alerts-value") is None
        schema = {"type": "record", "name": "a", "fields": [{"name": "x", "type": "long"}]}
        schema_id = registry.register("alerts-value", schema, same_alerts=True)
        assert registry.register("alerts-value", schema, same_alerts=True) == schema_id
        assert json.loads(registry.schema(schema_id)) == schema
        other = {"type": "record", "name": "b", "fields": [{"name": "y", "type": "int"}]}
        with pytest.raises(SkyfilterError, match="are not a version of them"):
            registry.register("alerts-value", other, same_alerts=True)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SkyfilterError, match="cannot reach schema registry"):
        ConfluentRegistry(f"http://127.0.0.1:{server.server_port}").latest("x")


def test_consumer_lag_from_a_checkpoint_and_latest_offsets(tmp_path):
    from skyfilter.kafka.lag import checkpoint_topic, committed_offsets, lag_per_partition

    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    assert committed_offsets(checkpoint, "alerts") == (None, {})
    for batch, ends in ((0, {"0": 5, "1": 7}), (1, {"0": 9, "1": 7})):
        (checkpoint / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n' + json.dumps({"alerts": ends}))
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    assert committed_offsets(checkpoint, "alerts") == (0, {0: 5, 1: 7}), "batch 1 is planned, not committed"
    assert committed_offsets(checkpoint, "alerts", 1) == (1, {0: 9, 1: 7})
    assert committed_offsets(checkpoint, "other") == (0, {})
    assert checkpoint_topic(checkpoint) == "alerts"
    assert lag_per_partition({0: 12, 1: 7, 2: 3}, {0: 5, 1: 7}) == {0: 7, 1: 0, 2: 3}


def test_memory_of_a_process_tree_by_process():
    import subprocess
    import sys
    import time
    from pathlib import Path

    from skyfilter.local.memory import RssSampler, breakdown, process_label, process_tree_rss, spawning_copy

    script = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 10
        while len(process_tree_rss(parent.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        tree = process_tree_rss(parent.pid)
        assert {label for label, _ in tree.values()} == {Path(sys.executable).name, "sleep"}
        assert all(mb > 0 for _, mb in tree.values())
        with RssSampler({"tree": lambda: parent.pid}, interval_s=0.05) as sampler:
            time.sleep(0.3)
        assert sampler.peak_total() == pytest.approx(sampler.peak("tree"))
        assert "sleep" in sampler.peak_breakdown() and sampler.peak_breakdown().startswith("tree: ")
    finally:
        parent.kill()
        parent.wait()
    assert breakdown({1: ("java", 3000.0), 2: ("pyspark.daemon", 50.0), 3: ("pyspark.daemon", 70.0)}) == \
        "java 3,000 MB, 2 x pyspark.daemon 120 MB"
    assert process_tree_rss(parent.pid) == {}
    java = ["/usr/lib/jvm/java-17-openjdk-amd64/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit"]
    assert spawning_copy(java, java) and not spawning_copy(["chmod", "644", "f"], java)
    daemon = ["/venv/bin/python", "-m", "pyspark.daemon", "pyspark.worker"]
    assert not spawning_copy(daemon, daemon)  # forked Python workers hold memory of their own: counted
    assert process_label(daemon) == "pyspark.daemon" and process_label(java) == "java"


def test_the_sections_are_typed_objects_read_from_the_files(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("stream:\n  trigger: 0\n  realtime:\n    checkpoint_interval: 30s\nmonitoring:\n  port: null\n")
    cfg = Config.load(path, overrides={"archive.nice": 5})
    assert cfg.stream.trigger == "0", "a trigger written as a number is still the text Spark takes"
    assert cfg.stream.realtime.checkpoint_interval == "30s" and cfg.monitoring.port is None
    assert cfg.archive.nice == 5 and cfg.kafka.security.protocol == "PLAINTEXT"
    changed = cfg.with_values({"archive.nice": 7})
    assert changed.archive.nice == 7 and cfg.archive.nice == 5, "a new config; the one loaded never changes"
    assert not hasattr(cfg, "set"), "nothing changes a config in place"
    changed = cfg.with_values({"kafka.base_port": "9100"})
    assert changed.kafka.base_port == 9100 and changed.kafka.connect_wait_s == 60.0, "each value of its key's type"
    with pytest.raises(SkyfilterError, match="config key 'kafka.base_port' must be a number, not 'ninety'"):
        cfg.with_values({"kafka.base_port": "ninety"})
    path.write_text("kafka:\n  heap: null\n")
    with pytest.raises(SkyfilterError, match="mine.yaml: config key 'kafka.heap' cannot be null"):
        Config.load(path)
    path.write_text("stream:\n  realtime:\n    checkpoint_intervall: 30s\n")
    with pytest.raises(SkyfilterError, match=r"unknown config key 'stream.realtime.checkpoint_intervall' "
                                             r"\(did you mean 'stream.realtime.checkpoint_interval'\?\)"):
        Config.load(path)
    path.write_text("maintenance:\n  tables: alerts\n")
    with pytest.raises(SkyfilterError, match="config key 'maintenance.tables' must be a list, not 'alerts'"):
        Config.load(path)


def test_a_misspelt_key_or_a_wrong_kind_of_value_is_one_line_naming_the_file_and_key(tmp_path):
    for name in ("local", "cluster", "secure", "docker"):
        Config.load(ROOT / "conf" / f"{name}.yaml")  # every shipped file is valid
    path = tmp_path / "mine.yaml"
    path.write_text(f"extends: {ROOT / 'conf' / 'local.yaml'}\nstream:\n  trigerr: 5s\n")
    with pytest.raises(SkyfilterError, match=r"mine.yaml: unknown config key 'stream.trigerr' "
                                             r"\(did you mean 'stream.trigger'\?\)"):
        Config.load(path)
    path.write_text(f"extends: {ROOT / 'conf' / 'local.yaml'}\nstream:\n  hot_reload: sometimes\n")
    with pytest.raises(SkyfilterError, match="config key 'stream.hot_reload' must be true or false"):
        Config.load(path)
    with pytest.raises(SkyfilterError, match=r"--set archive.tasks: config key 'archive.tasks' must be a number"):
        Config.load(overrides={"archive.tasks": "two"})
    path.write_text(f"extends: {ROOT / 'conf' / 'local.yaml'}\nproducer:\n  socket.timeout.ms: 1000\n")
    cfg = Config.load(path, overrides={"stream.trigger": "realtime", "monitoring.port": None})
    assert cfg.stream.trigger == "realtime" and cfg.get("producer")["socket.timeout.ms"] == 1000


def test_durations_in_spark_form_and_in_seconds():
    from skyfilter.plan.triggers import duration, seconds

    assert duration("500ms") == "500 milliseconds" and duration("5m") == "5 minutes" and duration(0) == "0 seconds"
    assert [seconds(text) for text in ("500ms", "5s", "5", "1m", "5m", "2h")] == [0.5, 5, 5, 60, 300, 7200]
    with pytest.raises(SkyfilterError, match="is not a duration like 500ms, 5s or 1m"):
        seconds("five minutes")


def test_the_python_daemon_drops_spark_archives_only_where_pyspark_is_installed(tmp_path):
    from skyfilter.spark.python_daemon import without_archives

    site, lib = tmp_path / "site-packages", tmp_path / "lib"
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    lib.mkdir()
    archives = [lib / "pyspark.zip", lib / "py4j-0.10.9.9-src.zip", lib / "spark-core_2.13-4.1.1.jar"]
    for archive in archives:
        archive.write_bytes(b"PK")
    shipped = tmp_path / "skyfilter.zip"  # a user's --py-files zip: the workers import from it
    shipped.write_bytes(b"PK")
    paths = [str(tmp_path), *map(str, archives), str(lib / "python311.zip"), str(shipped), str(site)]
    assert without_archives(paths) == [str(tmp_path), str(lib / "python311.zip"), str(shipped), str(site)]
    assert without_archives([p for p in paths if p != str(site)]) == [p for p in paths if p != str(site)], \
        "a worker whose only pyspark is the zip keeps it"



def test_batch_match_rows_count_per_filter_per_broker_and_per_visit():
    """The observed match rows ("visit:mask") give what per-filter count_if aggregates give, and the caps' counts."""
    from pathlib import Path

    from skyfilter.core.brokers import BrokerSpec
    from skyfilter.core.filter_loader import FilterSpec
    from skyfilter.delivery.batch_figures import read_matches
    from skyfilter.delivery.caps import VisitCaps

    filters = [FilterSpec(name, Path(f"{name}.sql"), "sql", "") for name in ("a", "b", "c")]
    brokers = [BrokerSpec("first", ["a"], "t1", enabled_filters=["a"], max_alerts_per_visit=2),
               BrokerSpec("off", ["c"], "t0", enabled_filters=[]),  # no working filter: no slot figures
               BrokerSpec("second", ["b", "c"], "t2", enabled_filters=["b", "c"], max_alerts_per_visit=None)]
    rows = ",".join(["7:100", "7:110", "7:101", "8:001", "8:100", ":010"])  # the last alert has no visit id
    matches = read_matches({"matched": rows}, filters, brokers)
    assert matches.by_filter == {"a": 4, "b": 2, "c": 2}
    assert matches.by_broker == {"first": 4, "second": 4}
    assert dict(matches.by_slot_visit) == {(0, 7): 3, (0, 8): 1, (2, 7): 2, (2, 8): 1}
    assert read_matches({"matched": None}, filters, brokers).by_broker == {"first": 0, "second": 0}
    assert read_matches({"matched": ""}, [], brokers).by_filter == {}
    assert read_matches({"matched": rows + ",7:1000"}, filters, brokers) == matches, "a row of 4 filters: not counted"
    counted = read_matches({"f:a": 4, "f:b": 2, "f:c": 2, "b:first": 4, "b:second": 4}, filters, brokers)
    assert (counted.by_filter, counted.by_broker) == (matches.by_filter, matches.by_broker), "Real-time Mode's form"

    decision = VisitCaps().record(brokers, matches.by_slot_visit, {7: "2026-11-25", 8: "2026-11-25"})
    assert decision.delivered_by_broker == {"first": 3, "second": 3}  # the cap of 2 took one of visit 7's three
    assert decision.dropped_by_broker == {"first": 1, "second": 0}
