"""The archive lane killed mid-night and restarted, while the delivery lane runs in its own process:
delivery never pauses (alerts produced meanwhile are delivered as fast as before), and the archive ends
with every alert and every match exactly once."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, decode_messages, fault_row, stream_args, write_files
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

TOPICS = {"spark": "lanes.alerts", "delta-rs": "lanes-rs.alerts"}  # a topic and a broker per archive writer


class Job:
    """One filter_stream.py process (one lane), its output lines and the time each line came."""

    def __init__(self, cfg, folder, topic: str, lane: str, *extra: str):
        command = [sys.executable, str(ROOT / "pipelines" / "filter_stream.py"), "--topic", topic, "--lane", lane,
                   "--filters-dir", str(folder / "filters"), "--brokers", str(folder / "brokers.yaml"),
                   "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir),
                   "--set", "monitoring.port=null", "--starting-offsets", "earliest", *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time(), line.strip()))

    def wait_for(self, text: str, timeout: float = 240) -> float:
        """When the job printed a line containing ``text`` (waiting for it)."""
        deadline = time.time() + timeout
        while True:
            found = [moment for moment, line in list(self.lines) if text in line]
            if found:
                return found[0]
            assert self.process.poll() is None, f"job exited early: {self.lines[-5:]}"
            assert time.time() < deadline, f"no '{text}' within {timeout} s: {self.lines[-5:]}"
            time.sleep(0.1)

    def archived(self) -> int:
        return sum(int(line.split(": ")[1].split()[0]) for _, line in list(self.lines)
                   if line.startswith("archive batch "))

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)  # driver, JVM and Python workers at once
        self.process.wait(30)


@pytest.mark.parametrize("writer", ["spark", "delta-rs"])
def test_killing_the_archive_lane_never_pauses_delivery_and_the_archive_ends_exactly_once(
        kafka_cfg, spark, tmp_path, fault_report, writer):
    topic, broker = TOPICS[writer], f"lanes_{writer.replace('-', '_')}"
    write_files(tmp_path / "filters", {"some.sql": "diaSource.snr > 10"})
    (tmp_path / "brokers.yaml").write_text(f"max_alerts_per_visit: null\nbrokers:\n  {broker}:\n    filters: [some]\n")
    produce(kafka_cfg, ProduceOptions(topic=topic, visits=1, alerts_per_visit=5, interval_s=0.0, stamps=False,
                                      seed=40, night="2026-11-08", progress=False))
    delivery = Job(kafka_cfg, tmp_path, topic, "delivery", "--trigger", "0")
    archive = Job(kafka_cfg, tmp_path, topic, "archive", "--archive-trigger", "1s", "--set", f"archive.writer={writer}")
    delivery.wait_for("batch 0: ")
    archive.wait_for("archive batch ")  # both lanes warm: the warm-up visit is delivered and archived
    if writer == "delta-rs":
        archive.wait_for("delta-rs, no JVM")  # its start line: the archive runs without Spark
    produced: list = []
    producer = threading.Thread(target=lambda: produced.append(produce(kafka_cfg, ProduceOptions(
        topic=topic, visits=10, alerts_per_visit=20, interval_s=2.5, stamps=True, seed=41, night="2026-11-09",
        progress=False))))
    began = time.time()
    producer.start()
    try:
        # mid-night: once the night's first visit is archived, or 10 s into the night at the latest
        while archive.archived() < 25 and time.time() - began < 10:
            assert archive.process.poll() is None, archive.lines[-5:]
            time.sleep(0.2)
        archive.kill()
        killed_at = time.time()
        time.sleep(6)
        archive = Job(kafka_cfg, tmp_path, topic, "archive", "--archive-trigger", "1s", "--set",
                      f"archive.writer={writer}")
        back_at = archive.wait_for("archive batch ")  # the restarted lane archives again
        producer.join(120)
        assert produced and produced[0].alerts == 200 and produced[0].failures == 0
        delivered = time.time()
        while sum(1 for _, line in delivery.lines if line.startswith("batch ")) == 0 or \
                time.time() - max(moment for moment, _ in delivery.lines) < 5:
            assert time.time() - delivered < 120, delivery.lines[-5:]
            time.sleep(0.5)
    finally:
        for job in (delivery, archive):
            if job.process.poll() is None:
                job.kill()
    run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml",  # the archive catches up, once
                    extra=["--lane", "archive", "--set", f"archive.writer={writer}"]), spark)

    records = decode_messages(read_topic(kafka_cfg, topic), rubin_schema("10.0"))
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 10}
    messages = read_topic(kafka_cfg, f"filtered.{broker}")
    before = [m.latency_ms for m in messages if began <= int(m.headers["input_time"]) / 1000 < killed_at]
    during = [m.latency_ms for m in messages if killed_at <= int(m.headers["input_time"]) / 1000 < back_at]
    assert len(before) >= 10 and len(during) >= 10, (len(before), len(during))
    assert statistics.median(during) <= 2 * statistics.median(before) + 1000, (sorted(before), sorted(during))
    assert max(during) <= max(max(before) * 2, 5000), (sorted(before), sorted(during))

    tables = table_paths(kafka_cfg, topic)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    row = fault_row(f"kill -9 the archive lane mid-night, restart it 6 s later (delivery in its own process, "
                    f"archive.writer {writer})",
                    len(records), alerts, [m.headers["alert_id"] for m in messages], expected)
    fault_report.append(row)
    assert row["archived"] == row["archive_rows"] == len(records) == 205, "every alert archived exactly once"
    assert row["lost"] == 0 and row["duplicated"] == 0
    matches = spark.read.format("delta").load(str(tables["matches"]))
    assert sorted(r.alert_id for r in matches.collect()) == sorted(expected), "every match archived exactly once"


def test_a_full_disk_under_the_archive_leaves_delivery_alone_and_loses_nothing_when_space_returns(
        kafka_cfg, spark, tmp_path, fault_report):
    """The archive's files stop fitting (its process may write files of at most 32 KiB: ``RLIMIT_FSIZE``, what
    a full disk does to a writer, without root): delivery goes on at its pace, the archive says once that it
    falls behind and retries the same batch; when the limit goes, it catches up, every alert once."""
    import psutil

    topic, broker = "lanes-full.alerts", "lanes_full"
    write_files(tmp_path / "filters", {"some.sql": "diaSource.snr > 10"})
    (tmp_path / "brokers.yaml").write_text(f"max_alerts_per_visit: null\nbrokers:\n  {broker}:\n    filters: [some]\n")
    produce(kafka_cfg, ProduceOptions(topic=topic, visits=1, alerts_per_visit=5, interval_s=0.0, stamps=False,
                                      seed=50, night="2026-11-10", progress=False))
    delivery = Job(kafka_cfg, tmp_path, topic, "delivery", "--trigger", "0")
    archive = Job(kafka_cfg, tmp_path, topic, "archive", "--archive-trigger", "1s", "--set", "archive.writer=delta-rs")
    try:
        delivery.wait_for("batch 0: ")
        archive.wait_for("archive batch ")
        archived_before = archive.archived()
        writer = psutil.Process(archive.process.pid)
        writer.rlimit(psutil.RLIMIT_FSIZE, (32 * 1024, psutil.RLIM_INFINITY))  # the disk is full from now on
        full_from = time.time()
        night = produce(kafka_cfg, ProduceOptions(topic=topic, visits=4, alerts_per_visit=20, interval_s=2.0,
                                                  stamps=True, seed=51, night="2026-11-11", progress=False))
        said = archive.wait_for("the disk under the tables is full", 60)
        records = decode_messages(read_topic(kafka_cfg, topic), rubin_schema("10.0"))
        expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 10}
        deadline = time.time() + 120
        while len(read_topic(kafka_cfg, f"filtered.{broker}")) < len(expected):
            assert time.time() < deadline, "delivery stalled while the archive's disk was full"
            time.sleep(1)
        assert archive.archived() == archived_before, "nothing archived while the disk is full"
        # the alerts writer says it once (the delivery log's small files may fit between its stalls, each said;
        # a log file that no longer fits echoes the line in Python's "Logging error" report)
        said_full = [line for _, line in archive.lines if line.startswith("archive: the disk under the tables is full")]
        assert sum(f"of '{topic}':" in line for line in said_full) == 1, "\n".join(line for _, line in archive.lines)
        writer.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))  # space returns
        back = archive.wait_for("again after", 60)
        deadline = time.time() + 120
        while archive.archived() < archived_before + night.alerts:
            assert time.time() < deadline, archive.lines[-5:]
            time.sleep(0.5)
        for job in (delivery, archive):
            os.kill(job.process.pid, signal.SIGTERM)  # the Python job, as an operator stops it
        assert [job.process.wait(120) for job in (delivery, archive)] == [0, 0], archive.lines[-5:]
    finally:
        for job in (delivery, archive):
            if job.process.poll() is None:
                job.kill()

    messages = read_topic(kafka_cfg, f"filtered.{broker}")
    night_latency = [m.latency_ms for m in messages if int(m.headers["input_time"]) / 1000 >= full_from]
    assert len(night_latency) >= 10 and statistics.median(night_latency) < 5000, sorted(night_latency)
    alerts = spark.read.format("delta").load(str(table_paths(kafka_cfg, topic)["alerts"]))
    row = fault_row("the archive's disk full while 4 visits arrive and are delivered (RLIMIT_FSIZE 32 KiB), "
                    f"then space returns ({back - said:.0f} s after it was said)", len(records), alerts,
                    [m.headers["alert_id"] for m in messages], expected)
    fault_report.append(row)
    assert row["archived"] == row["archive_rows"] == len(records) == 85, "every alert archived exactly once"
    assert row["lost"] == 0 and row["duplicated"] == 0


@pytest.mark.parametrize("with_marks", [True, False], ids=["stored-marks", "read-back"])
def test_rows_from_the_delivery_log_are_stored_once_however_often_they_come(spark, tmp_path, with_marks):
    """A delivery batch logged twice (it was retried), in the same or a later archive batch, and an archive
    batch retried after a crash: each row is stored once, with the stored marks (in the common case the table
    is not read back) and without them."""
    from skyfilter.archive.insert_once import StoredMarks, insert_new

    path = tmp_path / "matches"
    keys = ["night", "broker", "kafka_partition", "kafka_offset"]
    schema = "night string, broker string, kafka_partition int, kafka_offset long, batch_id long"
    spans = "night string, kafka_partition int, low long, high long"
    first = [("2026-11-10", "b1", 0, 10, 1), ("2026-11-10", "b2", 0, 10, 1), ("2026-11-10", "b1", 1, 11, 1)]
    again = first[1:] + [("2026-11-10", "b1", 1, 12, 2), ("2026-11-11", "b1", 0, 3, 2)]
    later = [("2026-11-10", "b1", 0, 20, 3), ("2026-11-10", "b1", 2, 1, 3), ("2026-11-11", "b2", 0, 4, 3)]
    last = [("2026-11-10", "b1", 0, 21, 4)]

    def marks() -> StoredMarks | None:  # a new one: the archive lane started again
        return StoredMarks(path, keys, ["kafka_partition"], "night") if with_marks else None

    def insert(rows: list[tuple], batch_id: int, stored_marks: StoredMarks | None) -> list[tuple]:
        insert_new(spark.createDataFrame(rows, schema), path, keys, "test", batch_id, "night", stored_marks)
        return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())

    running = marks()
    assert insert(first + first[:1], 0, running) == sorted(first)
    assert insert(again, 1, running) == sorted(first + again[2:]), "a retried delivery batch: its new rows only"
    assert insert([("2026-11-11", "b9", 0, 99, 3)], 1, running) == sorted(first + again[2:]), \
        "a retried archive batch appends nothing"
    assert insert(later, 2, running) == sorted(first + again[2:] + later), "above the marks, a new partition"
    restarted = marks()
    assert insert(later[:1] + last, 3, restarted) == sorted(first + again[2:] + later + last), \
        "after a restart, the marks come from the table"
    if restarted is not None:
        assert restarted.above(spark, spark.createDataFrame([("2026-11-10", 0, 22, 22), ("2026-11-12", 5, 0, 0)],
                                                            spans).collect()), "above every mark, a new night"
        assert not restarted.above(spark, spark.createDataFrame([("2026-11-10", 0, 21, 22)], spans).collect())
