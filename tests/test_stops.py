"""Stopping a stream the way operators do: a signal to the ``spark-submit`` process.

``$!`` after ``spark-submit ... &``, systemd's main pid and a Kubernetes
container's first process are spark-submit's JVM, not the Python job under it.
SIGTERM or SIGINT there must stop the job cleanly within 30 s (the batch under
way finished, the archive caught up, the summary printed, exit 0) without a
recovery line or a Java error; a second signal stops it at once.  Micro-batch
lanes with the archive in its own process (SIGTERM to every process of the job,
as systemd's default KillMode=control-group sends it), and Real-time Mode (SIGINT
to spark-submit alone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import decode_messages, stream_args, stream_folder, stream_process
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.lag import LatestOffsets
from skyfilter.kafka.read_back import read_topic
from skyfilter.local.status import status_file
from skyfilter.plan.tables import table_paths
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import KafkaTopicRegistry, subject_for
from skyfilter.schemas.avro import rubin_schema
from skyfilter.spark.session import SPARK_LOG

NIGHT = "2026-11-21"
BROKERS = """
brokers:
  stop_bright:
    filters: [bright]
    max_alerts_per_visit: null
"""
NOT_ON_A_CLEAN_STOP = ("SPARK-55271", "recovered from its checkpoint", "StackOverflowError", "InterruptedException",
                       "Traceback", "Exception in thread")


def submit(cfg, topic: str, folder: Path, extra: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """``spark-submit pipelines/filter_stream.py``, once it runs (the topic's schema registered first, as a
    producer would)."""
    KafkaTopicRegistry(cfg).register(subject_for(topic), rubin_schema(cfg.simulation.schema_version),
                                      same_alerts=True)
    return stream_process(cfg, topic, folder, ["--set", "monitoring.port=null", *extra], submit=True)


def _produce(cfg, topic: str, seed: int, first_visit: int = 1) -> int:
    report = produce(cfg, ProduceOptions(topic=topic, visits=2, alerts_per_visit=40, interval_s=1.0, seed=seed,
                                         night=NIGHT, first_visit=first_visit, progress=False))
    return report.alerts


def _wait_for(condition, seconds: float, lines: list[str]) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "\n".join(lines[-30:])
        time.sleep(0.5)


@pytest.mark.parametrize("trigger, stop", [("1s", signal.SIGTERM), ("realtime", signal.SIGINT)])
def test_a_signal_to_spark_submit_stops_the_job_cleanly(kafka_cfg, spark, tmp_path, trigger, stop):
    """Started as a new stream on a topic that already holds alerts in every partition: none of those is read,
    the archive's two queries start where delivery does (its process never restarts), and the console from the
    start to the signal has no ERROR line."""
    topic = f"stops.{trigger}"
    folder = stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20"}, BROKERS)
    _produce(kafka_cfg, topic, seed=60, first_visit=90)  # from an earlier stream
    before = LatestOffsets(kafka_cfg)
    try:
        held = before(topic)
    finally:
        before.close()
    assert len(held) == kafka_cfg.topics.alerts_partitions and all(held.values()), "alerts in every partition"
    job, lines = submit(kafka_cfg, topic, folder, [
        "--trigger", trigger, "--archive-trigger", "2s", "--set", "stream.realtime.checkpoint_interval=5s"])
    produced = _produce(kafka_cfg, topic, seed=61)
    _wait_for(lambda: any("alerts archived" in line for line in lines), 120, lines)
    produced += _produce(kafka_cfg, topic, seed=62, first_visit=3)  # alerts arriving as the signal comes
    about = json.loads(status_file(kafka_cfg, topic).read_text())
    job.send_signal(stop)  # to spark-submit's JVM, as `kill $!` does
    if stop == signal.SIGTERM:  # and to every process of the job, as systemd's KillMode=control-group does
        for pid in (about["pid"], about["archive_pid"]):
            os.kill(pid, signal.SIGTERM)
    signalled = time.time()
    code = job.wait(timeout=120)
    took = time.time() - signalled
    time.sleep(0.5)
    output = "\n".join(lines)
    (tmp_path / "job.log").write_text(f"{output}\n[test] stopped {took:.1f} s after {stop.name}\n")
    assert code == 0, output[-4000:]
    assert took <= 30, f"stopped {took:.1f} s after {stop.name}"
    assert "stopping on signal SIG" in output  # spark-submit's JVM passes the signal on as SIGTERM
    [summary] = [line for line in lines if " alerts in, " in line]
    read = int(summary.split(" alerts in, ")[0].rsplit(" ", 1)[-1])
    after = [line for line in lines if "Real-time Mode counts at its checkpoints" in line]
    read += int(after[0].split("the ")[1].split(" alert")[0]) if after else 0
    assert not [word for word in NOT_ON_A_CLEAN_STOP if word in output], output[-4000:]
    assert not [line for line in lines if " ERROR " in line], "no ERROR line from the start to the stop"
    assert f"holds {sum(held.values())} message(s) from before this stream was launched" in output
    assert not [line for line in lines if line.startswith("archive lane (pid")], "the archive process never ended"

    archived = spark.read.format("delta").load(str(table_paths(kafka_cfg, topic)["alerts"]))
    assert archived.count() == produced == archived.select("alert_id").distinct().count(), \
        "the archive caught up with everything read before the stop"
    matches = spark.read.format("delta").load(str(table_paths(kafka_cfg, topic)["matches"]))
    sent = {m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.stop_bright")}
    assert sent and {r.alert_id for r in matches.select("alert_id").collect()} == sent, \
        "the archive's delivery-log query stored every match the job delivered"
    if trigger == "realtime":
        assert read == produced, "the summary counts what Real-time Mode read after its last checkpoint"
    else:  # what the delivery lane had not read when it stopped, the next start delivers; nothing twice
        rest = run(stream_args(kafka_cfg, topic, folder / "filters", folder / "brokers.yaml",
                               extra=["--lane", "delivery"]), spark)
        assert read + rest.input_alerts == produced, "read before the stop, or by the next start, never twice"
    delivered = [m.headers["alert_id"] for m in read_topic(kafka_cfg, "filtered.stop_bright")]
    since_start = [m for m in read_topic(kafka_cfg, topic) if m.offset >= held[m.partition]]
    records = decode_messages(since_start, rubin_schema(kafka_cfg.simulation.schema_version))
    expected = sorted(str(r["diaSourceId"]) for r in records if r["diaSource"]["snr"] > 20)

    if trigger == "realtime":  # at least once: what it sent since its last checkpoint is sent again
        assert sorted(set(delivered)) == expected
    else:
        assert sorted(delivered) == expected, "micro-batches stopped between batches: nothing sent twice"


def test_a_second_signal_stops_at_once(kafka_cfg, tmp_path):
    topic = "stops.twice"
    folder = stream_folder(tmp_path, {"bright.sql": "diaSource.snr > 20"}, BROKERS)
    job, lines = submit(kafka_cfg, topic, folder, ["--trigger", "1s", "--archive-trigger", "20s"])
    job.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    job.send_signal(signal.SIGTERM)
    signalled = time.time()
    code = job.wait(timeout=60)
    assert time.time() - signalled < 5 and code == 128 + signal.SIGTERM, "\n".join(lines[-20:])


def test_java_errors_are_one_line_on_the_console_and_whole_in_the_log_file(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("from pyspark.sql import functions as F\n"
                      "from skyfilter.spark.session import get_spark\n"
                      "spark = get_spark('one-line-errors', master='local[1]')\n"
                      "try:\n"
                      "    spark.range(3).select(F.raise_error(F.lit('boom from a task'))).collect()\n"
                      "except Exception as exc:\n"
                      "    print('python saw:', str(exc).splitlines()[0])\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    console = result.stderr.splitlines()
    assert "python saw: [USER_RAISED_EXCEPTION] boom from a task" in result.stdout
    assert not [line for line in console if line.lstrip().startswith("at ")], result.stderr[-2000:]
    failed = [line for line in console if "boom from a task" in line]
    assert failed and all(f"in {SPARK_LOG}" in line for line in failed)
    assert "\tat org.apache.spark" in SPARK_LOG.read_text()[-200_000:], "the stack traces are in the log file"
