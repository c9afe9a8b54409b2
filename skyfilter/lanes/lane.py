"""What every lane of a stream job shares: Spark, the plan, the Kafka sink settings, the monitor, the totals."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.filtering.input_schemas import InputSchemas, InputWatch
from skyfilter.lanes.monitoring import StreamMonitor
from skyfilter.lanes.totals import StreamTotals
from skyfilter.plan.outputs import prepare_outputs, register_writers
from skyfilter.plan.stream_plan import PlanCell, StreamPlan, template_frame
from skyfilter.registry.client import open_registry
from skyfilter.spark.internals import warm_up_kafka_clients

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneServices:
    """The pieces of one stream job that its delivery, real-time and archive lanes all use.

    The plan is shared through its cell: hot reload, quarantine and new input schema
    versions swap a new plan in for every lane at once.  The config is the job's: it
    says where things are (Kafka, the registry, the run folder) and how lanes run.
    """

    spark: SparkSession
    cfg: Config
    cell: PlanCell
    kafka_options: dict[str, str]  # the Kafka sink's connection settings
    monitor: StreamMonitor
    totals: StreamTotals


class Lane:
    """Base of the lanes: exposes the shared services as attributes.

    Each lane writes to Kafka through its own producer (Spark keeps one per set of
    options, so a lane's ``client.id`` sets it apart): small real-time records never
    queue behind the archive lane's copy of every alert, and brokers can tell the
    lanes apart (metrics, quotas).  The id names the lane only, not the stream, so a
    JVM that runs many streams in turn (benchmarks, tests) keeps three producers.
    """

    def __init__(self, services: LaneServices, name: str):
        self.services = services
        self.spark = services.spark
        self.cfg = services.cfg
        self.cell = services.cell
        self.plan: StreamPlan = services.cell.current  # the plan of the batch under way (see take_plan)
        self.kafka_options = {**services.kafka_options, "kafka.client.id": f"skyfilter-{name}"}
        self.monitor = services.monitor
        self.totals = services.totals
        self.input_watch = InputWatch(self.cfg, f"{name} lane")

    def take_plan(self) -> StreamPlan:
        """Take the plan in force now for the batch that starts (a swap never lands in the middle of a batch)."""
        self.plan = self.cell.current
        return self.plan

    def refresh_inputs(self, seen: list[int] | None = None) -> None:
        """Adopt the input schema versions registered since the last look (for every lane sharing the plan).

        Called before each micro-batch: a producer registers a version before it
        sends alerts of it, so every id in the batch is known by then.  ``full``
        broker topics get the new version registered under its id.
        """
        new: dict[int, str] = {}

        def adopt(plan: StreamPlan) -> StreamPlan | None:
            updated = self.input_watch.check(plan.inputs, seen)
            if updated is None:
                return None
            new.update({i: text for i, text in updated.readable.items() if i not in plan.inputs.readable})
            if updated.reader == plan.inputs.reader:
                return replace(plan, inputs=updated)
            return self._with_reader(plan, updated)

        plan = self.cell.update(adopt)  # the lanes look from their own threads: one at a time
        full = [b.topic for b in plan.brokers if b.format == "full"]
        if not (new and full):
            return
        try:
            registry = open_registry(self.cfg, output=True)
            for topic in full:
                register_writers(registry, topic, new)
        except SkyfilterError as exc:
            logger.info(f"input schemas: {exc}")

    def _with_reader(self, plan: StreamPlan, inputs: InputSchemas) -> StreamPlan:
        """``plan`` reading its input as ``inputs``' new reader: the outputs built from the reader (``nocutouts``,
        ``lite``) are registered anew, so they follow the input's newest version."""
        template, _ = template_frame(self.spark, self.cfg, inputs)
        try:
            encodings = prepare_outputs(self.cfg, template, inputs, plan.cutouts, plan.brokers, plan.filters)
        except SkyfilterError as exc:
            logger.info(f"input schemas: {exc}; the outputs keep their schemas")
            encodings = plan.encodings
        return replace(plan, inputs=inputs, encodings=encodings)

    def warm_up_kafka(self, topics: list[str], input_topic: str) -> None:
        """Load the Kafka clients' classes, fetch the metadata of ``topics`` and read ``input_topic``'s end
        before the first alert.

        Spark creates a sink's producer on the first record it writes, and a source's
        consumers in the first batch's tasks; the first time in a JVM each costs a few
        hundred milliseconds, which the first visit of a night would wait for.  A
        throwaway producer and consumer with the lane's settings pay it here, without
        writing anything or moving any offset (0.15-0.2 s off a night's first batch).
        """
        settings = {key[len("kafka."):]: str(value) for key, value in self.kafka_options.items()
                    if key.startswith("kafka.")}
        warm_up_kafka_clients(self.spark, settings, topics, input_topic,
                              f"{self.kafka_options['kafka.client.id']}-warm-up")


def between_batches(query: StreamingQuery, deadline: float) -> bool:
    """Wait until ``query`` is between two batches (its trigger idle), at most until ``deadline`` (monotonic);
    False if it never was."""
    while query.isActive and query.status.get("isTriggerActive", False):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
