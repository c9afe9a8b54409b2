"""The figures a delivery batch observes on its own Spark job, and what the driver reads from them.

Each delivery batch reports how many alerts came in and were rejected, their
latency, and how many alerts each filter and each broker matched (per visit, for
the caps).  ``Dataset.observe`` computes them in the batch's one job.  Spark
generates an observation's aggregation code again in every task, so one
``count_if`` per filter (100 filters, 100 aggregates) cost about 0.45 s of a
2,000-alert batch.  Instead, each alert that matched a filter contributes one
short *match row*, ``visit:mask`` (one character per filter, ``1`` for a match),
computed in the batch's compiled projection and gathered by a single aggregate;
the driver counts the masks.  The figures are then a few aggregates whatever the
number of filters, and the rows cost one byte per filter and matching alert.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.filtering.decode import is_accepted
from skyfilter.filtering.filter_eval import PYTHON_COLUMN, REPORT_FIELD, filter_column
from skyfilter.plan.outgoing import any_of, live_brokers, matched_filters
from skyfilter.spark.steps import Step, drop, observe, with_columns

MATCH_ROW = "_match_row"  # per alert: "visit:mask" when a filter matched it, else null
VISIT_NIGHT = "_visit_night"  # per accepted alert: "visit:night"
MATCHED = "matched"  # observed: the batch's match rows, comma-joined
FIGURE_COLUMNS = (MATCH_ROW, VISIT_NIGHT)


def figure_column_step(filters: list[FilterSpec]) -> Step:
    """The columns the observed figures gather (drop :data:`FIGURE_COLUMNS` after the ``observe``).

    They are computed in the batch's compiled code, so that the observation's own
    per-task code is a handful of aggregates over ready columns.
    """
    flags = [F.col(filter_column(spec.name)) for spec in filters]
    mask = F.concat(*[F.when(flag, F.lit("1")).otherwise(F.lit("0")) for flag in flags]) if flags else F.lit("")
    visit = F.coalesce(F.col("visit_id").cast("string"), F.lit(""))
    return with_columns({
        MATCH_ROW: F.when(any_of(flags), F.concat(visit, F.lit(":"), mask)),
        VISIT_NIGHT: F.when(is_accepted(), F.concat_ws(":", "visit_id", "night")),
    })


def figure_aggregates(filters: list[FilterSpec], brokers: list[BrokerSpec] | None = None) -> list[Column]:
    """The aggregates a delivery batch observes, over the columns of :func:`figure_column_step`.

    With ``brokers``, matches are counted per filter and per broker (over the
    filter and broker-match columns alone: no figure columns needed) instead of
    gathered as match rows: figures of a constant size, for Real-time Mode, whose
    figures cover a whole checkpoint interval and stay in the query's recent
    progress (its long-lived tasks build the aggregation code once per interval).
    Real-time Mode has no one delivery time to measure a latency against, so it
    leaves out the input times' percentiles, a quantile summary updated per alert
    that it never read.
    """
    accepted = is_accepted()
    figures = [F.count(F.lit(1)).alias("input_alerts"), F.count_if(~accepted).alias("rejected")]
    if brokers is None:  # a batch's latency (against its delivery time), the caps' visits and its match rows
        millis = F.unix_millis("kafka_timestamp").cast("double")
        figures += [F.percentile_approx(F.when(accepted, millis), [0.01, 0.05, 0.5], 10000).alias("appended_ms"),
                    F.min(F.when(accepted, millis)).alias("first_ms"),
                    F.collect_set(VISIT_NIGHT).alias("visits"),
                    F.array_join(F.collect_list(MATCH_ROW), ",").alias(MATCHED)]
    else:
        figures += [F.count_if(F.col(filter_column(spec.name))).alias(f"f:{spec.name}") for spec in filters]
        figures += [F.count_if(F.col(matched_filters(slot)).isNotNull()).alias(f"b:{broker.name}")
                    for slot, broker in live_brokers(brokers)]
    if any(spec.kind == "python" for spec in filters):
        figures.append(F.collect_list(F.col(PYTHON_COLUMN)[REPORT_FIELD]).alias("python_reports"))
    return figures


def observe_steps(filters: list[FilterSpec]) -> list[Step]:
    """Observe a batch's figures (in :class:`~skyfilter.spark.steps.JvmSteps`); the rows' columns stay as they were."""
    return [figure_column_step(filters), observe(*figure_aggregates(filters)), drop(*FIGURE_COLUMNS)]


@dataclass
class BatchMatches:
    """What a batch's match rows say, before the caps: matches per filter, per broker, per (broker slot, visit)."""

    by_filter: dict[str, int]
    by_broker: dict[str, int]
    by_slot_visit: Counter


def read_matches(observed: dict, filters: list[FilterSpec], brokers: list[BrokerSpec]) -> BatchMatches:
    """A batch's matches from its observed figures (:func:`figure_aggregates`): per filter, per live broker and,
    from match rows, per (broker slot, visit).

    A broker matched an alert when any of its filters did.  ``filters`` are the
    lane's filters in the order of the masks; rows of another filter set are not
    counted.
    """
    live = live_brokers(brokers)
    if MATCHED not in observed:  # counted per filter and broker
        return BatchMatches({spec.name: observed.get(f"f:{spec.name}") or 0 for spec in filters},
                            {b.name: observed.get(f"b:{b.name}") or 0 for _, b in live}, Counter())
    rows = [row for row in (observed[MATCHED] or "").split(",") if len(row) - row.find(":") - 1 == len(filters)]
    if not rows or not filters:
        return BatchMatches({spec.name: 0 for spec in filters}, {b.name: 0 for _, b in live}, Counter())
    visits = [row.partition(":")[0] for row in rows]
    known = np.array([bool(v) for v in visits])
    visit_ids = np.array([int(v) if v else 0 for v in visits])
    masks = np.frombuffer("".join(row.partition(":")[2] for row in rows).encode("ascii"), dtype=np.uint8)
    hits = masks.reshape(len(rows), len(filters)) == ord("1")
    position = {spec.name: i for i, spec in enumerate(filters)}
    by_broker, by_slot_visit = {}, Counter()
    for slot, broker in live:
        columns = [position[name] for name in broker.enabled_filters if name in position]
        matched = hits[:, columns].any(axis=1) if columns else np.zeros(len(rows), dtype=bool)
        by_broker[broker.name] = int(matched.sum())
        for visit, count in zip(*np.unique(visit_ids[matched & known], return_counts=True), strict=True):
            by_slot_visit[(slot, int(visit))] = int(count)
    by_filter = {spec.name: int(n) for spec, n in zip(filters, hits.sum(axis=0), strict=True)}
    return BatchMatches(by_filter, by_broker, by_slot_visit)
