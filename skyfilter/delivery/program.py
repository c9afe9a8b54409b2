"""What a delivery batch computes, built once per plan and applied to every batch.

A batch's DataFrame is the same query over new Kafka rows: decode without
the cutouts, evaluate every filter, name each broker's matched filters, make
the re-encodings the matches need and drop the decoded fields, observe the
batch's figures, apply the per-visit caps, and turn each alert into its Kafka
rows (``skyfilter/plan/outgoing.py``).  :class:`DeliveryProgram` holds
those Column expressions as steps (``skyfilter/spark/steps.py``), so a batch costs a
few hundred JVM round trips instead of thousands; what earlier batches
delivered (the caps' memory) comes in as a literal column.  A reload or a
quarantine changes the plan, and the lane builds a new program (see
:func:`program_key`).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.delivery.batch_figures import observe_steps
from skyfilter.delivery.caps import DELIVERED_BEFORE, VisitCaps, capped, decision_steps, slim_steps
from skyfilter.filtering.decode import alert_field_names, decode_steps, is_accepted
from skyfilter.filtering.filter_eval import FilterSet, filter_steps
from skyfilter.plan.outgoing import (
    BATCH_ID_COLUMN,
    broker_match_step,
    encode_step,
    message_steps,
    with_batch_id,
)
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA, StreamPlan
from skyfilter.spark.plan_template import PlanTemplate
from skyfilter.spark.steps import JvmSteps, Step, apply_steps, drop
from skyfilter.watch.columns import WATCH_DOWN_COLUMN, used_by, watch_steps

_observation_ids = itertools.count()


def lane_filters(plan: StreamPlan, brokers: list[BrokerSpec]) -> list[FilterSpec]:
    """The filters some of these brokers use, in the plan's order."""
    wanted = {name for broker in brokers for name in broker.enabled_filters}
    return [spec for spec in plan.filters if spec.name in wanted]


def evaluate_steps(plan: StreamPlan, brokers: list[BrokerSpec], realtime: bool = False,
                   workers: FilterSet | None = None, watch_workers: FilterSet | None = None) -> list[Step]:
    """Kafka rows to alerts decoded without cutouts, with the watchlist and watchmap columns the filters name,
    each filter's verdict and each broker's matches.

    ``realtime``: an input schema id the plan does not know stops the query (see ``skyfilter/filtering/decode.py``),
    and Python filters report only their errors; ``workers``: the Python filters are called alert by alert in
    these filter workers instead of a pandas UDF (Real-time Mode); ``watch_workers``: likewise, the lists and maps.
    """
    budget = plan.filter_time_budget_s
    filters = lane_filters(plan, brokers)
    return [*decode_steps(plan.inputs, plan.columns, plan.night_offset_hours, plan.max_alert_bytes,
                          plan.reader_json, realtime),
            *watch_steps(plan.watch.chosen(used_by(filters)), plan.columns.ra, plan.columns.dec, is_accepted(),
                         watch_workers),
            *filter_steps(filters, is_accepted(), budget, not realtime, workers,
                          F.col(WATCH_DOWN_COLUMN).isNotNull() if watch_workers is not None else None),
            broker_match_step(brokers)]


def evaluate(plan: StreamPlan, raw: DataFrame, brokers: list[BrokerSpec], realtime: bool = False,
             workers: FilterSet | None = None, watch_workers: FilterSet | None = None) -> DataFrame:
    """Kafka rows decoded without cutouts, with each filter's verdict and each broker's matched filters."""
    return apply_steps(raw, evaluate_steps(plan, brokers, realtime, workers, watch_workers))


def encode_and_narrow_steps(plan: StreamPlan, brokers: list[BrokerSpec], decided: bool) -> list[Step]:
    """The brokers' re-encodings made, then the decoded alert's own fields dropped, before a lane observes its figures.

    Spark's ``observe`` (and a shuffle) copies every column it is given into Spark's
    row format: with the decoded alert's thousands of nested fields still there, that
    copy cost CPU per alert and a megabyte of generated code per plan.  ``decided``:
    see :func:`~skyfilter.plan.outgoing.encode_step`.
    """
    return [encode_step(brokers, plan.encodings, decided), drop(*alert_field_names(plan.reader_json))]


def program_key(plan: StreamPlan, brokers: list[BrokerSpec], dead_letters: bool) -> Hashable:
    """What a program depends on, by value: equal keys, same program."""
    return plan.value_key, tuple(brokers), dead_letters


class DeliveryProgram:
    """The delivery lane's query for one plan and broker set, ready to apply to batches of Kafka rows.

    Its columns are built once and kept in the JVM (:class:`~skyfilter.spark.steps.JvmSteps`): a batch
    costs a dozen round trips to the JVM, whatever the number of filters and brokers.
    """

    def __init__(self, spark: SparkSession, plan: StreamPlan, brokers: list[BrokerSpec], dead_letters: bool):
        self.brokers = brokers
        self.filters = lane_filters(plan, brokers)
        evaluate = [*evaluate_steps(plan, brokers), *encode_and_narrow_steps(plan, brokers, decided=False)]
        # the caps' slimming step names every column: read them once from an empty batch (only with caps)
        slim = slim_steps(apply_steps(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), evaluate).columns,
                          brokers) if capped(brokers) else []
        self.head = JvmSteps(spark, [*evaluate, *observe_steps(self.filters), *slim])
        self.tail = JvmSteps(spark, [*decision_steps(brokers), *message_steps(
            brokers, plan.encodings, plan.deadletter_topic if dead_letters else None, plan.delivery_log_topic,
            writers=plan.inputs.readable)])
        self._template: PlanTemplate | None = None

    def apply(self, raw: DataFrame, batch_id: int, caps: VisitCaps) -> tuple[DataFrame, Observation]:
        """The Kafka rows of a batch of input rows, and the observation that will hold its figures.

        The first batch's query is built and analysed; later batches replay it on their rows
        (:class:`~skyfilter.spark.plan_template.PlanTemplate`), with their id and the caps' memory.
        """
        values = {BATCH_ID_COLUMN: str(batch_id), DELIVERED_BEFORE: caps.delivered_before(self.brokers)}
        if self._template is not None:
            try:
                replayed = self._template.apply(raw, values)
            except Exception:  # noqa: BLE001 - a plan Spark would not take: build this batch as the first one
                replayed = self._template = None
            if replayed is not None and replayed[1] is not None:
                return replayed
        observation = Observation(f"delivery_{next(_observation_ids)}")
        observed = self.head.apply(raw, observation)
        decided = caps.with_delivered_before(with_batch_id(observed, batch_id), self.brokers)
        rows = self.tail.apply(decided)
        self._template = PlanTemplate.of(rows, raw, tuple(values))
        return rows, observation
