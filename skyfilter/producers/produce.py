"""Producing visits of alerts into Kafka, on a fixed cadence, from one or several processes.

Visit ``k`` starts ``k * interval`` seconds after the first, as in the
DMTN-028 testbed; each visit's alerts are split across the producer
processes.  Per visit we keep the DMTN-028 figures: start, finish and the
serialize+send time (finish - start, flush included).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer

logger = logging.getLogger(__name__)

PROGRESS_EVERY = 100


class AlertSource:
    """What a producer process needs: the messages of its share of a visit."""

    visits: int
    alerts_per_visit: int

    def messages(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs of the alerts of ``visit`` whose index % shares == share."""
        raise NotImplementedError

    def visit_id(self, visit: int) -> int | None:
        return None

    def prepare(self, share: int, shares: int) -> None:
        """Work a producer process does before the first visit's clock starts (e.g. loading its share)."""


@dataclass
class VisitReport:
    """DMTN-028 figures of one visit."""

    visit: int
    visit_id: int | None
    alerts: int = 0
    bytes: int = 0
    start: float = float("inf")
    finish: float = 0.0
    failures: int = 0
    first_error: str = ""

    @property
    def seconds(self) -> float:
        """Serialize + send time: first send of any process to the last flush."""
        return max(self.finish - self.start, 0.0)


@dataclass
class ProduceReport:
    """What a produce run did."""

    topic: str
    schema_id: int
    processes: int
    visits: list[VisitReport] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def alerts(self) -> int:
        return sum(v.alerts for v in self.visits)

    @property
    def bytes(self) -> int:
        return sum(v.bytes for v in self.visits)

    @property
    def failures(self) -> int:
        return sum(v.failures for v in self.visits)

    def summary(self) -> str:
        rate = self.alerts / self.elapsed if self.elapsed else 0.0
        return (f"produced {self.alerts} alerts ({self.bytes / 1e6:.1f} MB) in {len(self.visits)} visit(s) "
                f"to '{self.topic}' (schema id {self.schema_id}) with {self.processes} process(es) "
                f"in {self.elapsed:.1f} s: {rate:.0f} alerts/s, {self.failures} failed")


def produce_share(producer: Producer, topic: str, source: AlertSource, visit: int, share: int, shares: int,
                  on_progress=None, spread_s: float = 0.0) -> dict:
    """Send one process's share of a visit and wait for every delivery report; with ``spread_s``, the share's
    alerts are sent evenly over that many seconds instead of at once (a steady rate, not a burst)."""
    failures = {"count": 0, "first": ""}

    def delivered(error, _message):
        if error is not None:
            failures["count"] += 1
            failures["first"] = failures["first"] or error.str()

    sent = size = pending = 0
    start = time.time()
    gap = spread_s * shares / max(source.alerts_per_visit, 1)
    for key, value in source.messages(visit, share, shares):
        if gap:
            time.sleep(max(0.0, start + sent * gap - time.time()))
            producer.poll(0)
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
        size += len(value)
        pending += 1
        if pending >= PROGRESS_EVERY:
            producer.poll(0)
            if on_progress:
                on_progress(pending)
            pending = 0
    remaining = producer.flush(120)
    if on_progress and pending:
        on_progress(pending)
    return {"visit": visit, "alerts": sent, "bytes": size, "start": start, "finish": time.time(),
            "failures": failures["count"] + remaining, "first_error": failures["first"] or
            (f"{remaining} messages not delivered within 120 s" if remaining else "")}


def _worker(conf: dict, topic: str, source: AlertSource, share: int, shares: int, interval_s: float,
            clock_start, results: mp.Queue, spread_s: float = 0.0) -> None:
    """A producer process: its share prepared, then one Producer sending its share of every visit on time."""
    producer = Producer(conf)
    source.prepare(share, shares)
    results.put(("ready", share))
    while clock_start.value == 0.0:  # set by the parent once every process is ready
        time.sleep(0.01)
    for visit, start_at in _schedule(clock_start.value, source.visits, interval_s):
        time.sleep(max(0.0, start_at - time.time()))
        results.put(("done", produce_share(producer, topic, source, visit, share, shares,
                                           lambda n: results.put(("progress", n)), spread_s)))


def _schedule(began: float, visits: int, interval_s: float) -> list[tuple[int, float]]:
    """(visit, start time): visit ``k`` starts ``k * interval_s`` after the first, one second after ``began``."""
    return [(v, began + 1.0 + v * interval_s) for v in range(visits)]


def run_producers(conf: dict, topic: str, source: AlertSource, schema_id: int, interval_s: float,
                  processes: int = 1, progress: bool = True, spread_s: float = 0.0) -> ProduceReport:
    """Produce every visit of ``source`` with ``processes`` producer processes (each visit spread over
    ``spread_s`` seconds, see :func:`produce_share`).

    The visits' clock starts once every process has prepared its share
    (:meth:`AlertSource.prepare`), so the first visit is not late and the next
    ones do not follow it in a burst.
    """
    from tqdm import tqdm

    report = ProduceReport(topic, schema_id, processes,
                           [VisitReport(v, source.visit_id(v)) for v in range(source.visits)])
    bar = tqdm(total=source.visits * source.alerts_per_visit, unit="alert", disable=not progress,
               desc=f"producing to {topic}")
    if processes == 1:
        producer = Producer(conf)
        source.prepare(0, 1)
        began = time.time()
        for visit, start_at in _schedule(began, source.visits, interval_s):
            time.sleep(max(0.0, start_at - time.time()))
            _record(report, produce_share(producer, topic, source, visit, 0, 1, bar.update, spread_s), 1)
    else:
        context = mp.get_context("spawn")
        results, clock_start = context.Queue(), context.Value("d", 0.0)
        workers = [context.Process(target=_worker, args=(conf, topic, source, share, processes, interval_s,
                                                         clock_start, results, spread_s), daemon=True)
                   for share in range(processes)]
        for worker in workers:
            worker.start()
        ready, done, began = 0, {}, time.time()
        while len(done) < source.visits or sum(done.values()) < source.visits * processes:
            try:
                kind, payload = results.get(timeout=5)
            except queue.Empty:
                if not any(w.is_alive() for w in workers):
                    raise KafkaException("every producer process exited before finishing") from None
                continue
            if kind == "ready":
                ready += 1
                if ready == processes:
                    began = clock_start.value = time.time()
            elif kind == "progress":
                bar.update(payload)
            else:
                done[payload["visit"]] = done.get(payload["visit"], 0) + 1
                _record(report, payload, processes if done[payload["visit"]] == processes else 0)
        for worker in workers:
            worker.join(30)
    bar.close()
    report.elapsed = time.time() - began - 1.0
    return report


def _record(report: ProduceReport, result: dict, complete_after: int) -> None:
    """Fold one process's share into its visit; log the visit line once all shares are in."""
    visit = report.visits[result["visit"]]
    visit.alerts += result["alerts"]
    visit.bytes += result["bytes"]
    visit.start = min(visit.start, result["start"])
    visit.finish = max(visit.finish, result["finish"])
    visit.failures += result["failures"]
    visit.first_error = visit.first_error or result["first_error"]
    if complete_after:
        ident = f" (visit_id {visit.visit_id})" if visit.visit_id else ""
        logger.info(f"visit {visit.visit + 1}/{len(report.visits)}{ident}: {visit.alerts} alerts, "
                    f"start {clock(visit.start)}, finish {clock(visit.finish)}, serialize+send {visit.seconds:.3f} s"
            + (f", {visit.failures} FAILED: {visit.first_error}" if visit.failures else ""))


def clock(timestamp: float) -> str:
    """HH:MM:SS.mmm (UTC) of a Unix time."""
    return time.strftime("%H:%M:%S", time.gmtime(timestamp)) + f".{int(timestamp % 1 * 1000):03d}"
