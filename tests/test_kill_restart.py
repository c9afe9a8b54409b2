"""Kill the stream job (SIGKILL, driver and JVM) at three points while alerts arrive; the archive stays exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from conftest import ROOT, decode_messages, fault_row, stream_args, write_files
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

TOPIC = "kill.alerts"
VISITS = 20  # 40 s of visits: alerts keep coming while the job is killed and restarted...
LATE_VISITS = 3  # ...and these come after the third start, so a batch is under way to kill however slow it was
PRODUCED = (VISITS + LATE_VISITS) * 30


def start_stream(cfg, folder) -> tuple[subprocess.Popen, list[str]]:
    command = [sys.executable, str(ROOT / "pipelines" / "filter_stream.py"), "--topic", TOPIC,
               "--filters-dir", str(folder / "filters"), "--brokers", str(folder / "brokers.yaml"),
               "--bootstrap", cfg.bootstrap_servers, "--state-dir", str(cfg.state_dir), "--trigger", "1s",
               "--set", "stream.max_offsets_per_trigger=20", "--archive-trigger", "2s",
               "--starting-offsets", "earliest"]  # the night started before the stream
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.strip() for line in process.stdout), daemon=True).start()
    return process, lines


def wait_for(lines: list[str], text: str, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not any(text in line for line in lines):
        assert process.poll() is None, f"stream exited early: {lines[-5:]}"
        assert time.time() < deadline, f"no '{text}' within {timeout} s: {lines[-5:]}"
        time.sleep(0.1)


def in_batch(checkpoint) -> bool:
    """Whether the lane of this checkpoint is inside a batch (its offsets planned, no commit yet)."""
    def last(folder: str) -> int:
        ids = [int(p.name) for p in (checkpoint / folder).glob("*") if p.name.isdigit()]
        return max(ids, default=-1)

    return last("offsets") > last("commits")


def kill_job(process: subprocess.Popen, checkpoint) -> bool:
    """SIGKILL the whole job (its archive process dies with it); True when it died inside a batch."""
    os.killpg(process.pid, signal.SIGKILL)  # driver, JVM and Python workers at once
    process.wait(30)
    return in_batch(checkpoint)


def wait_until_in_batch(checkpoint, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not in_batch(checkpoint):
        assert process.poll() is None and time.time() < deadline, "no batch started"
        time.sleep(0.01)


def test_archive_is_exact_after_three_sigkills(kafka_cfg, spark, tmp_path, fault_report):
    write_files(tmp_path / "filters", {"some.sql": "diaSource.snr > 15"})
    (tmp_path / "brokers.yaml").write_text("max_alerts_per_visit: null\nbrokers:\n  kill_b:\n    filters: [some]\n")
    produced = []
    producer = threading.Thread(target=lambda: produced.append(produce(kafka_cfg, ProduceOptions(
        topic=TOPIC, visits=VISITS, alerts_per_visit=30, interval_s=2.0, stamps=True, seed=21, night="2026-11-12",
        progress=False))))
    producer.start()

    checkpoint = kafka_cfg.checkpoint_dir / TOPIC / "delivery"
    mid_batch = []
    # 1: during start-up and the first batches
    process, lines = start_stream(kafka_cfg, tmp_path)
    wait_for(lines, "running: ", process)
    time.sleep(2.5)
    mid_batch.append(kill_job(process, checkpoint))
    # 2: at a batch boundary, as the next batch starts
    process, lines = start_stream(kafka_cfg, tmp_path)
    wait_for(lines, "batch ", process)
    time.sleep(0.3)
    mid_batch.append(kill_job(process, checkpoint))
    # 3: in the middle of a later batch, as soon as it is planned
    process, lines = start_stream(kafka_cfg, tmp_path)
    wait_for(lines, "batch ", process)
    producer.join(300)
    late = produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=LATE_VISITS, alerts_per_visit=30, interval_s=0.0,
                                             stamps=True, seed=22, night="2026-11-12", first_visit=VISITS + 1,
                                             progress=False))
    wait_until_in_batch(checkpoint, process)
    mid_batch.append(kill_job(process, checkpoint))
    assert any(mid_batch), "at least one kill must interrupt a batch for this test to mean anything"

    assert produced and produced[0].alerts + late.alerts == PRODUCED and produced[0].failures == late.failures == 0
    run(stream_args(kafka_cfg, TOPIC, tmp_path / "filters", tmp_path / "brokers.yaml"), spark)
    tables = table_paths(kafka_cfg, TOPIC)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    assert alerts.count() == PRODUCED == alerts.select("alert_id").distinct().count(), "every alert exactly once"
    assert alerts.where("length(kafka_value) > 10000").count() == PRODUCED, "each with its message, cutouts included"
    metrics = spark.read.format("delta").load(str(tables["metrics"]))
    assert metrics.count() == metrics.select("lane", "query_id", "batch_id").distinct().count()
    matches = spark.read.format("delta").load(str(tables["matches"]))
    assert matches.count() == matches.select("broker", "alert_id").distinct().count(), "each match archived once"

    # The broker topic: at least once; a killed batch is sent again, so duplicates are bounded by one
    # batch (max_offsets_per_trigger = 20 alerts) per kill, and each carries its alert id to drop them by.
    records = decode_messages(read_topic(kafka_cfg, TOPIC), rubin_schema("10.0"))
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 15}
    delivered = [m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.kill_b")]
    row = fault_row("kill -9 the Spark driver 3 times (one mid-batch), restart each time", PRODUCED, alerts,
                    delivered, expected)
    fault_report.append(row)
    assert row["expected"] > 0 and row["lost"] == 0, "every match delivered at least once"
    assert row["duplicated"] <= 3 * 20
