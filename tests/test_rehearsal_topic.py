"""The rehearsal topic: the input topic's latest alerts copied, topped up with probes, read from where it starts."""

import json

from confluent_kafka import Producer

from skyfilter.delivery.realtime_reads import rehearsal_reader
from skyfilter.delivery.rehearsal_topic import fill_rehearsal, rehearsal_topic
from skyfilter.kafka.read_back import read_topic
from skyfilter.kafka.topics import ensure_topics, topic_partitions


def test_the_rehearsal_reads_apart_from_the_night_with_the_same_address():
    assert rehearsal_reader("night:realtime") == "night:realtime.rehearsal"
    assert rehearsal_reader("night:realtime@10.0.0.5:4040/abc") == "night:realtime.rehearsal@10.0.0.5:4040/abc"
    assert rehearsal_topic("alerts", "alerts") == "alerts.rehearsal"
    assert rehearsal_topic("alerts", "tonight") == "alerts.rehearsal.tonight"


def test_a_rehearsal_copies_the_latest_alerts_then_probes(kafka_cfg):
    topic = "rehearsal.input"
    ensure_topics(kafka_cfg, {topic: 3})
    producer = Producer({"bootstrap.servers": kafka_cfg.bootstrap_servers})
    for index in range(30):
        producer.produce(topic, f"alert-{index}".encode(), key=str(index).encode(), partition=index % 3)
    producer.flush(10)

    first = fill_rehearsal(kafka_cfg, topic, "night1", 12, [b"probe"])
    assert (first.topic, first.copied, first.probes, first.alerts) == ("rehearsal.input.rehearsal.night1", 12, 0, 12)
    assert topic_partitions(kafka_cfg, first.topic) == 3, "one partition per input partition: as many tasks"
    copied = read_topic(kafka_cfg, first.topic)
    assert sorted(m.value for m in copied) == sorted(f"alert-{i}".encode() for i in range(18, 30)), \
        "the latest 4 of each partition, each in its own partition"
    assert all(m.value == f"alert-{m.key.decode()}".encode() and int(m.key) % 3 == m.partition for m in copied)
    assert json.loads(first.starting_offsets) == {first.topic: {"0": 0, "1": 0, "2": 0}}

    second = fill_rehearsal(kafka_cfg, topic, "night1", 40, [b"", b"probe"])
    assert (second.copied, second.probes) == (30, 10), "all 30 alerts, and probes for the rest"
    assert json.loads(second.starting_offsets) == {second.topic: {"0": 4, "1": 4, "2": 4}}, \
        "a second rehearsal reads only what it wrote"
    later = [m.value for m in read_topic(kafka_cfg, second.topic)][12:]
    assert later.count(b"probe") == 5 and later.count(b"") + later.count(None) == 5

    empty = fill_rehearsal(kafka_cfg, "rehearsal.empty", "n", 5, [b"probe"]) if ensure_topics(
        kafka_cfg, {"rehearsal.empty": 2}) is not None else None
    assert (empty.copied, empty.probes) == (0, 5), "a fresh topic: probes only"
