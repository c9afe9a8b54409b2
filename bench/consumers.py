"""Plain consumer processes (confluent-kafka, optionally fastavro and a filter): the baselines' readers."""

from __future__ import annotations

import io
import multiprocessing as mp
import time


def consume(conf: dict, topic: str, partitions: list[int], schema: dict | None, filter_index: int | None,
            results: mp.Queue) -> None:
    """A plain consumer process: read the partitions to their end, decode and filter if asked; report counts."""
    import fastavro
    from confluent_kafka import Consumer, TopicPartition
    from fastavro.schema import parse_schema

    from bench.filter_sets import matches
    from skyfilter.schemas.wire import HEADER_SIZE

    parsed = parse_schema(schema) if schema else None
    consumer = Consumer(conf)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
    consumer.assign([TopicPartition(topic, p, low) for p, (low, high) in ends.items() if high > low])
    remaining = {p: high for p, (low, high) in ends.items() if high > low}
    count = selected = size = 0
    ready = time.time()
    while remaining:
        for message in consumer.consume(500, timeout=0.2):
            if message.error():
                raise RuntimeError(message.error().str())
            value = message.value()
            count += 1
            size += len(value)
            if parsed is not None:
                alert = fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), parsed, None)
                if filter_index is not None and matches(filter_index, alert):
                    selected += 1
            if message.offset() + 1 >= remaining.get(message.partition(), 0):
                remaining.pop(message.partition(), None)
    consumer.close()
    results.put({"alerts": count, "bytes": size, "selected": selected, "ready": ready, "finished": time.time()})


def run_consumers(cfg, topic: str, jobs: list[tuple[list[int], int | None]], schema: dict | None) -> dict:
    """Run one consumer process per job (partitions, filter); alerts/s from the first process ready (assigned its
    partitions; process start-up excluded) to the last one done."""
    from skyfilter.kafka.clients import client_settings

    context = mp.get_context("spawn")
    results = context.Queue()
    processes = []
    for partitions, filter_index in jobs:
        conf = client_settings(cfg, **{"group.id": f"bench-side-{time.time_ns()}", "enable.auto.commit": False,
                                       "fetch.max.bytes": 64 * 1024 * 1024, "log_level": 0})
        processes.append(context.Process(target=consume, args=(conf, topic, partitions, schema, filter_index,
                                                               results), daemon=True))
    for process in processes:
        process.start()
    reports = [results.get(timeout=3600) for _ in processes]
    for process in processes:
        process.join(30)
    seconds = max(r["finished"] for r in reports) - min(r["ready"] for r in reports)
    each_reads_all = jobs[0][1] is not None
    per_process = reports[0]["alerts"] if each_reads_all else sum(r["alerts"] for r in reports)
    return {"processes": len(processes), "alerts": per_process, "seconds": round(seconds, 3),
            "alerts_per_s": round(per_process / seconds, 1)}
