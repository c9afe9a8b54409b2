"""The delivery lane in micro-batches: input topic to broker topics and dead letters, one Spark job per batch.

Per batch: decode once without the cutouts, evaluate every filter, apply the
per-visit caps, write every broker message, dead letter and delivery-log
record through one Kafka sink.  No Delta commit and no cache: the batch's
figures come from ``Dataset.observe`` on that same job, and one summary record
goes to the delivery log for the archive lane (``skyfilter/archive/alerts_lane.py``)
to turn into the ``metrics`` and ``broker_visits`` tables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

from pyspark.sql import DataFrame, Observation

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.figures import DeliveryFigures, FilterReports
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.core.lane_names import LaneName
from skyfilter.delivery.batch_figures import BatchMatches, read_matches
from skyfilter.delivery.caps import VisitCaps
from skyfilter.delivery.program import DeliveryProgram, program_key
from skyfilter.filtering.filter_eval import merge_reports
from skyfilter.lanes.delivery_log import SummaryWriter, checkpoint_query_id
from skyfilter.lanes.lane import Lane, LaneServices
from skyfilter.plan.quarantine import Quarantine
from skyfilter.plan.reload import PlanReloader
from skyfilter.plan.stream_plan import StreamPlan, probe_batch

logger = logging.getLogger(__name__)

LANE = LaneName.DELIVERY
# Spark's V1 Kafka writer runs the query in a nested execution whose observed metrics never reach an
# Observation (its get() would wait forever); the V2 writer runs it in the write's own execution.
V1_SOURCES_WITHOUT_KAFKA = ("spark.sql.sources.useV1SourceList", "avro,csv,json,orc,parquet,text")
# Adaptive execution runs each shuffle stage as a job of its own and re-plans between them; the caps' one
# small shuffle gains nothing from it.  Set on the delivery query's own session (Spark clones one per query).
ONE_JOB_PER_BATCH = ("spark.sql.adaptive.enabled", "false")
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"  # the caps' window: as many tasks as the batch has


def batch_stats(observed: dict, delivered: float | None, filters: list[FilterSpec], matches: BatchMatches,
                by_broker: dict[str, int], dropped: dict[str, int], sent: int) -> DeliveryFigures:
    """A batch's figures from its observation, its ``matches`` per filter, and what the caps let through
    (``by_broker``, ``dropped``, ``sent`` in all); latency up to ``delivered`` (None: records leave as they come,
    so the batch has no one delivery time)."""
    appended = observed.get("appended_ms") or [None, None, None]
    python = [spec.name for spec in filters if spec.kind == "python"]
    reports = merge_reports(observed.get("python_reports") or [])
    if delivered is None:
        latency, latency_max = (None, None, None), None
    else:
        ended_ms = delivered * 1000.0
        latency = tuple(None if q is None else ended_ms - q for q in reversed(appended))
        latency_max = None if observed.get("first_ms") is None else ended_ms - observed["first_ms"]
    return DeliveryFigures(
        input_alerts=observed["input_alerts"], rejected=observed["rejected"], latency=latency,
        latency_max=latency_max, by_filter=matches.by_filter, by_broker=by_broker, dropped_by_broker=dropped,
        matches=sent, reports=FilterReports(
            errors={name: r["error"] for name, r in reports.items() if r["error"]},
            samples={name: r["sample"] for name, r in reports.items() if r["error"] and r["sample"]},
            seconds={name: reports.get(name, {}).get("seconds", 0.0) for name in python}))


def summary_record(plan: StreamPlan, lane: str, run_id: str, batch_id: int, trigger: str, times: tuple,
                   stats: DeliveryFigures, figures: dict, broker_visits: list[dict]) -> dict:
    """The ``batch`` record of the delivery log: one ``metrics`` row and the batch's ``broker_visits``."""
    started, delivered, finished = times
    p50, p95, p99 = stats.latency
    return {"stream": plan.name, "lane": lane, "query_id": checkpoint_query_id(plan.lane_checkpoint(lane)),
            "run_id": run_id, "batch_id": batch_id, "trigger": trigger, "started_at_ms": started * 1000,
            "delivered_at_ms": None if delivered is None else delivered * 1000, "finished_at_ms": finished * 1000,
            "input_alerts": stats.input_alerts, "rejected": stats.rejected, "archived": None,
            "matches": stats.matches, "matches_by_broker": stats.by_broker,
            "matches_by_filter": stats.by_filter, "filter_errors": stats.reports.errors,
            "latency_p50_ms": p50, "latency_p95_ms": p95, "latency_p99_ms": p99,
            "latency_max_ms": stats.latency_max, **{k: figures[k] for k in (
                "input_rows_per_second", "processed_rows_per_second", "quarantined_filters")},
            "kafka_lag": {str(k): v for k, v in figures["kafka_lag"].items()}, "broker_visits": broker_visits}


class DeliveryLane(Lane):
    """The ``foreachBatch`` function of the micro-batch delivery lane."""

    def __init__(self, services: LaneServices, trigger: str, summaries: SummaryWriter, caps: VisitCaps,
                 serves: Callable[[BrokerSpec, StreamPlan], bool] = lambda broker, plan: True,
                 dead_letters: bool = True,
                 quarantine: Quarantine | None = None, reloader: PlanReloader | None = None, tasks: int = 2):
        super().__init__(services, LANE)
        self.tasks = tasks  # task slots a batch uses (``skyfilter/plan/slots.py``)
        self.trigger = trigger
        self.summaries = summaries
        self.caps = caps
        self.serves = serves
        self.dead_letters = dead_letters
        self.quarantine = quarantine
        self.reloader = reloader
        self._program: tuple[Hashable, DeliveryProgram] | None = None

    def brokers(self) -> list[BrokerSpec]:
        """The brokers this lane delivers to under the plan of its batch."""
        return [broker for broker in self.plan.brokers if self.serves(broker, self.plan)]

    def program(self) -> DeliveryProgram:
        """The batch query for the plan as it is now, built again only when a reload or quarantine changed it."""
        brokers = self.brokers()
        key = program_key(self.plan, brokers, self.dead_letters)
        if self._program is None or self._program[0] != key:
            self._program = key, DeliveryProgram(self.spark, self.plan, brokers, self.dead_letters)
        return self._program[1]

    def outgoing(self, raw: DataFrame, batch_id: int) -> tuple[DataFrame, Observation]:
        """The Kafka rows of a batch of input rows, and the observation that will hold its figures."""
        return self.program().apply(raw, batch_id, self.caps)

    def warm_up(self) -> None:
        """Start the Python workers, compile the plan and load the Kafka clients before the first alert arrives.

        Without this the first visit of a night would wait for them (several seconds).
        """
        probe = probe_batch(self.spark, self.plan)
        rows, _ = self.outgoing(probe, -1)
        rows.count()
        self.warm_up_kafka(self.plan.output_topics(self.program().brokers), self.plan.topic)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        self.refresh_inputs()
        if self.reloader is not None and self.reloader.check() and self.quarantine is not None:
            self.quarantine.refresh()
        self.take_plan()  # with whatever the look, the reload or a quarantine swapped in
        batch.sparkSession.conf.set(*ONE_JOB_PER_BATCH)
        batch.sparkSession.conf.set(SHUFFLE_PARTITIONS, str(self.tasks))
        program = self.program()
        brokers, filters = program.brokers, program.filters
        rows, observation = program.apply(batch, batch_id, self.caps)
        rows.write.format("kafka").options(**self.kafka_options).mode("append").save()
        delivered = time.time()
        observed = observation.get
        if not observed.get("input_alerts"):
            return
        matches = read_matches(observed, filters, brokers)
        nights = dict(_visit_night(text) for text in observed.get("visits") or [])
        decision = self.caps.record(brokers, matches.by_slot_visit, nights)
        stats = batch_stats(observed, delivered, filters, matches,
                            {b.name: 0 for b in brokers if b.enabled_filters} | decision.delivered_by_broker,
                            {b: n for b, n in decision.dropped_by_broker.items() if n}, decision.delivered)
        if self.quarantine is not None:
            self.quarantine.review(batch_id, stats.reports)
        quarantined = self.quarantine.quarantined() if self.quarantine is not None else []
        finished = time.time()
        figures = self.monitor.batch_figures(LANE, batch_id, started, finished, stats.input_alerts, quarantined)
        self.summaries.write(summary_record(self.plan, LANE, self.monitor.run_id, batch_id, self.trigger,
                                            (started, delivered, finished), stats, figures,
                                            [row._asdict() for row in decision.rows]))
        self.monitor.observe_delivery(LANE, batch_id, stats, figures, started, delivered, finished,
                                      [f.name for f in filters])
        self.totals.add_delivery(stats, started, finished)
        report_batch(LANE, batch_id, stats, self.plan.deadletter_topic, started, delivered)


def report_batch(lane: str, batch_id: int, stats: DeliveryFigures, deadletter_topic: str, started: float,
                 delivered: float | None) -> None:
    """The log lines of a finished delivery batch."""
    if stats.dropped_by_broker:
        logger.info(f"batch {batch_id}: over max_alerts_per_visit, not sent: " + ", ".join(
                    f"{broker} {count}" for broker, count in sorted(stats.dropped_by_broker.items())))
    for name, error in stats.reports.errors.items():
        logger.warning(f"batch {batch_id}: Python filter '{name}' failed, no matches from it in this batch: {error}")
    if stats.rejected:
        logger.warning(f"batch {batch_id}: {stats.rejected} message(s) could not be decoded; sent to "
                       f"'{deadletter_topic}' (the archive keeps them with their reason in its rejects table)")
    p50, _, p99 = stats.latency
    took = f"delivered in {delivered - started:.2f} s, " if delivered is not None else ""
    prefix = "batch" if lane == LANE else f"{lane} batch"
    logger.info(f"{prefix} {batch_id}: {stats.input_alerts} alerts, {stats.matches} matches, {took}"
                f"latency p50 {_sec(p50)} p99 {_sec(p99)}")


def _visit_night(text: str) -> tuple[int, str]:
    visit, _, night = text.partition(":")
    return int(visit), night


def _sec(millis: float | None) -> str:
    return "-" if millis is None else f"{millis / 1000:.2f} s"
