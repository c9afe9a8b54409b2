"""Python filter errors of Real-time Mode, heard from the delivery log as they happen.

A Real-time query reports its figures once per checkpoint interval (minutes).
A Python filter that raises, hangs or returns the wrong length must be
quarantined sooner: the query writes one ``filter_error`` record to the
delivery log, in the same Kafka write as its broker messages, and
:class:`FilterErrorWatch` reads them in the driver as they come (a consumer at
the log's end, in a thread of its own), for the stream's main loop to hand to
the quarantine (``skyfilter/plan/quarantine.py``).
"""

from __future__ import annotations

import json
import queue
import threading
import uuid

from pyspark.sql import Column
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.core.kafka_clients import client_settings
from skyfilter.filtering.filter_eval import PYTHON_COLUMN, REPORT_FIELD, merge_reports

KIND = "filter_error"


def error_record(lane: str) -> Column:
    """The JSON value of a delivery-log ``filter_error`` record: the lane and the failing filters' report,
    null on rows where no filter failed."""
    report = F.col(PYTHON_COLUMN)[REPORT_FIELD]
    return F.when(report.isNotNull(), F.to_json(F.struct(F.lit(KIND).alias("kind"), F.lit(lane).alias("lane"),
                                                         report.alias("report"))))


class FilterErrorWatch:
    """A consumer of the delivery log that keeps the ``filter_error`` records written since it started."""

    def __init__(self, cfg: Config, topic: str, log=print):
        self.cfg = cfg
        self.topic = topic
        self.log = log
        self.reports: queue.Queue[str] = queue.Queue()
        self.stopping = threading.Event()
        self.ready = threading.Event()  # assigned at the log's end: records from now on are seen
        self.thread = threading.Thread(target=self._run, daemon=True, name="filter-error-watch")

    def start(self, timeout_s: float = 30.0) -> FilterErrorWatch:
        """Start reading at the log's end; returns once the consumer is there (or ``timeout_s`` passed)."""
        self.thread.start()
        self.ready.wait(timeout_s)
        return self

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer(client_settings(self.cfg, **{
            "group.id": f"skyfilter-filter-errors-{uuid.uuid4()}", "enable.auto.commit": False, "log_level": 0,
            "fetch.wait.max.ms": 100}))
        try:
            metadata = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            partitions = sorted(metadata.partitions) if metadata is not None and metadata.error is None else [0]
            consumer.assign([TopicPartition(self.topic, p, OFFSET_END) for p in partitions])
            self.ready.set()
            while not self.stopping.is_set():
                message = consumer.poll(0.2)
                if message is None or message.error() is not None or message.value() is None:
                    continue
                if b'"kind":"filter_error"' in message.value()[:64]:
                    self.reports.put(json.loads(message.value())["report"])
        except Exception as exc:  # noqa: BLE001 - the watch must never take the stream down
            self.log(f"realtime: the filter error watch stopped ({exc}); Python filter errors are then "
                     f"quarantined at the next checkpoint")
        finally:
            self.ready.set()
            consumer.close()

    def drain(self) -> dict[str, dict]:
        """The errors heard since the last call, merged per filter (see :func:`merge_reports`)."""
        texts = []
        while True:
            try:
                texts.append(self.reports.get_nowait())
            except queue.Empty:
                return merge_reports(texts)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
