"""`skyfilter produce` against a real broker: parallel processes, visit cadence, DMTN-028 figures."""

from __future__ import annotations

import statistics

from conftest import saying
from skyfilter.kafka.read_back import read_topic
from skyfilter.kafka.topics import topic_partitions
from skyfilter.producers.command import ProduceOptions, produce, send_source
from skyfilter.producers.sources import SimulatedSource
from skyfilter.schemas.avro import rubin_schema
from skyfilter.schemas.wire import unframe


def test_parallel_producers_keep_the_visit_cadence_and_lose_nothing(kafka_cfg):
    lines: list[str] = []
    with saying(lines):
        report = produce(kafka_cfg, ProduceOptions(topic="prod.alerts", visits=3, alerts_per_visit=40, interval_s=2.0,
                                                   processes=2, stamps=False, night="2026-11-17", progress=False))
    assert report.alerts == 120 and report.failures == 0 and report.processes == 2
    starts = [visit.start for visit in report.visits]
    for earlier, later in zip(starts, starts[1:], strict=False):
        assert abs((later - earlier) - 2.0) < 0.5, "visits start on the 2 s cadence"
    assert all(0 < visit.seconds < 2.0 for visit in report.visits)
    assert len(lines) == 3 and all("serialize+send" in line and "start" in line for line in lines)
    messages = read_topic(kafka_cfg, "prod.alerts")
    assert len(messages) == 120 and len({m.key for m in messages}) == 120
    assert {unframe(m.value)[0] for m in messages} == {report.schema_id}
    assert topic_partitions(kafka_cfg, "prod.alerts") == kafka_cfg.topics.alerts_partitions


def test_visits_serialized_ahead_start_on_the_cadence_after_every_process_is_ready(kafka_cfg):
    schema = rubin_schema(kafka_cfg.simulation.schema_version)
    source = SimulatedSource(schema, 0, "2026-11-17", visits=3, alerts_per_visit=300, stamps=True, interval_s=1.0,
                             ahead=True)  # each process serializes 450 alerts with cutouts first: seconds
    report = send_source(kafka_cfg, "prod.ahead", source, schema, 1.0, processes=2, progress=False)
    assert report.alerts == 900 and report.failures == 0
    starts = [visit.start for visit in report.visits]
    for earlier, later in zip(starts, starts[1:], strict=False):
        assert abs((later - earlier) - 1.0) < 0.4, "no visit waits for the preparing, none follows in a burst"
    messages = read_topic(kafka_cfg, "prod.ahead")
    assert len(messages) == 900 and len({m.key for m in messages}) == 900
    # the same visit serialized as it is sent, on the same (possibly busy) machine: prepared visits take less
    on_the_fly = send_source(kafka_cfg, "prod.on-the-fly", SimulatedSource(
        schema, 0, "2026-11-17", visits=1, alerts_per_visit=300, stamps=True, interval_s=1.0, ahead=False),
        schema, 1.0, processes=2, progress=False)
    assert statistics.median(visit.seconds for visit in report.visits) < on_the_fly.visits[0].seconds, \
        "prepared visits are only sent"
