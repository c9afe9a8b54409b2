"""Hot reload on a running stream: added filters and brokers start at the next trigger, broken edits keep the
previous version, and no input alert is lost or archived twice."""

from __future__ import annotations

import threading
import time

from conftest import ARCHIVE_IN_THE_DRIVER, decode_messages, run_saying, stream_args, write_files
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import rubin_schema

TOPIC = "reload.alerts"
BROKERS = "max_alerts_per_visit: null\nbrokers:\n  r_all:\n    filters: [everything]\n"
BROKERS_AFTER = BROKERS + "  r_new:\n    filters: [bright]\n    format: nocutouts\n"


def _produce(cfg, night: str, seed: int) -> None:
    produce(cfg, ProduceOptions(topic=TOPIC, visits=1, alerts_per_visit=25, interval_s=0.0, stamps=False,
                                seed=seed, night=night, progress=False))


def _wait_for(lines: list[str], predicate, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate(lines):
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out; stream said: {lines[-5:]}")


def _archived(lines: list[str]) -> int:
    return sum(int(line.split(": ")[1].split(" alerts")[0]) for line in lines
               if line.startswith("batch ") and " alerts, " in line)


def test_filters_and_brokers_change_while_the_stream_runs(kafka_cfg, spark, tmp_path):
    filters = write_files(tmp_path / "filters", {"everything.sql": "alert_id IS NOT NULL"})
    brokers = tmp_path / "brokers.yaml"
    brokers.write_text(BROKERS)
    lines: list[str] = []
    args = stream_args(kafka_cfg, TOPIC, filters, brokers, extra=["--trigger", "1s", "--stop-when-idle", "10",
                                                                  "--starting-offsets", "earliest",
                                                                  *ARCHIVE_IN_THE_DRIVER])
    result = {}
    _produce(kafka_cfg, "2026-11-01", 1)
    stream = threading.Thread(target=lambda: result.setdefault("totals", run_saying(lines, lambda: run(args, spark))))
    stream.start()
    _wait_for(lines, lambda ls: _archived(ls) >= 25)

    (filters / "bright.sql").write_text("diaSource.snr > 20")          # a new filter...
    brokers.write_text(BROKERS_AFTER)                                    # ...for a new broker
    (filters / "everything.sql").write_text("alert_id IS NOT NULL AND (")  # a broken edit: the old version runs on
    _produce(kafka_cfg, "2026-11-02", 2)
    _wait_for(lines, lambda ls: _archived(ls) >= 50)
    stream.join(timeout=120)
    assert not stream.is_alive()

    reload_lines = [line for line in lines if line.startswith("reload: ")]
    assert any("filter(s) added: bright" in line and "broker(s) added: r_new" in line for line in reload_lines)
    assert any("everything.sql:1: SQL syntax error" in line and "its previous version keeps running" in line
               for line in reload_lines), reload_lines

    records = decode_messages(read_topic(kafka_cfg, TOPIC), rubin_schema("10.0"))
    second = [r for r in records if str(r["diaSource"]["visit"]).startswith("20261102")]  # produced after the edits
    assert len(second) == 25
    everything = read_topic(kafka_cfg, "filtered.r_all")
    assert sorted(m.headers["alert_id"] for m in everything) == sorted(str(r["diaSourceId"]) for r in records)
    new = read_topic(kafka_cfg, "filtered.r_new")
    expected_new = sorted(str(r["diaSourceId"]) for r in second if r["diaSource"]["snr"] > 20)
    assert expected_new and sorted(m.headers["alert_id"] for m in new) == expected_new

    alerts = spark.read.format("delta").load(str(kafka_cfg.delta_dir / TOPIC / "alerts"))
    assert alerts.count() == 50 and alerts.select("alert_id").distinct().count() == 50
    assert result["totals"].input_alerts == 50

    # A stream under a new name on this topic starts from its end: nothing is delivered twice
    again: list[str] = []
    later = threading.Thread(target=lambda: result.setdefault("again", run_saying(again, lambda: run(stream_args(
        kafka_cfg, TOPIC, filters, brokers, name="hr_again", extra=["--trigger", "1s", "--stop-when-idle", "8",
                                                                    "--lane", "delivery"]), spark))))
    later.start()
    _wait_for(again, lambda ls: any(line.startswith("stream 'hr_again' running") for line in ls))
    time.sleep(10)  # longer than --stop-when-idle before the night's first alert: the idle clock has not started
    assert later.is_alive(), again[-5:]
    _produce(kafka_cfg, "2026-11-03", 3)
    later.join(timeout=120)
    assert f"starting offsets: topic '{TOPIC}' holds 50 message(s) from before this stream was launched; they " \
           f"are not read (--starting-offsets earliest reads them)" in again
    assert result["again"].input_alerts == 25
