"""Stream behaviour beyond the happy path: the schema registry topic, failing filters, restarts."""

from __future__ import annotations

import pytest

from conftest import DATA, saying, stream_args, write_files
from skyfilter.core.errors import SkyfilterError
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.registry.client import KafkaTopicRegistry, subject_for
from skyfilter.schemas.avro import avro_files, read_container, rubin_schema

RAISES_PY = '''
from skyfilter import alert_filter


@alert_filter(columns=["diaSource.snr"])
def raises(snr):
    raise ValueError("this filter is broken at run time")
'''


def test_kafka_topic_registry_ids_are_stable_and_one_kind_of_alert_per_topic(kafka_cfg):
    registry = KafkaTopicRegistry(kafka_cfg)
    v10, v11 = rubin_schema("10.0"), rubin_schema("11.1")
    first = registry.register(subject_for("reg.test"), v10, same_alerts=True)
    again = KafkaTopicRegistry(kafka_cfg)  # another "machine"
    assert again.register(subject_for("reg.test"), v10, same_alerts=True) == first
    assert again.latest(subject_for("reg.test"))[0] == first
    second = again.register(subject_for("reg.test"), v11, same_alerts=True)  # a new version of the same alerts
    assert registry.versions(subject_for("reg.test")) == [first, second]
    ztf = read_container(avro_files([DATA / "ztf-3.3"])[0])[0]
    with pytest.raises(SkyfilterError, match=r"topic 'reg.test' carries alerts of schema id \d+ "
                                             r"\(lsst.v11_1.alert\); these \(ztf.alert\) are not a version of them"):
        again.register(subject_for("reg.test"), ztf, same_alerts=True)


def test_failing_python_filter_does_not_stop_the_others_and_restart_resumes(kafka_cfg, spark, tmp_path):
    topic = "behaviour.alerts"
    write_files(tmp_path / "filters", {"raises.py": RAISES_PY, "everything.sql": "diaSource.snr > 0"})
    (tmp_path / "brokers.yaml").write_text(
        "max_alerts_per_visit: null\nbrokers:\n  beh_all:\n    filters: [raises, everything]\n")
    options = dict(topic=topic, visits=1, alerts_per_visit=30, interval_s=0.0, stamps=False, progress=False)
    produce(kafka_cfg, ProduceOptions(night="2026-11-18", **options))
    lines: list[str] = []
    args = stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml")
    with saying(lines):
        first = run(args, spark)
    assert first.input_alerts == 30 and first.matches_by_filter["everything"] == 30
    assert first.matches_by_filter["raises"] == 0
    assert any("Python filter 'raises' failed" in line and "this filter is broken at run time" in line
               for line in lines)
    delivered = read_topic(kafka_cfg, "filtered.beh_all")
    assert len(delivered) == 30 and {m.headers["filters"] for m in delivered} == {"everything"}

    produce(kafka_cfg, ProduceOptions(night="2026-11-19", **options))
    second = run(args, spark)
    assert second.input_alerts == 30, "a restart resumes from the checkpoint, not from the beginning"
    archived = spark.read.format("delta").load(str(kafka_cfg.delta_dir / topic / "alerts"))
    assert archived.count() == 60 == archived.select("alert_id").distinct().count()
    assert {r.night for r in archived.select("night").distinct().collect()} == {"2026-11-18", "2026-11-19"}
