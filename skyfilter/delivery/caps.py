"""Per-broker caps: at most ``max_alerts_per_visit`` alerts of one visit go to a broker.

Which alerts are kept is deterministic: within a batch, a broker's matches
from one visit are taken in alert id order (numeric order for numeric ids:
shorter ids first, then lexicographic) until the cap is reached; a visit
spread over several batches fills its cap in batch order.  The rest are not
sent, and counted per (broker, visit) in the ``broker_visits`` table.

The decision is part of the batch's one Spark job: a window over each visit,
in alert id order, counts every capped broker's matches so far (one sort of
the batch's alerts for all brokers, with the bytes of alerts that matched
nothing left out), and an alert goes to a broker while that count stays within
the room the visit has left.  What earlier batches delivered is a small map
passed into the plan; the stream's delivery log restores it after a restart.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from skyfilter.core.brokers import BrokerSpec
from skyfilter.filtering.decode import is_accepted
from skyfilter.plan.outgoing import any_match, keep_every_match_step, kept, live_brokers, matched_filters
from skyfilter.spark.steps import Step, apply_steps, drop, select, with_columns

DELIVERED_BEFORE = "_delivered_before"  # per visit, what each capped broker received in earlier batches (JSON)
SENT_BEFORE = "_sent_before"  # this alert's visit's entry of it: what each capped broker received before
RECENT_NIGHTS = 2  # a visit never spans more than this many nights: older counts are forgotten
VISIT_CAP_FUNCTION = "skyfilter_visit_cap"  # Real-time Mode's cap, VisitCapLedger's SQL function


class BrokerVisit(NamedTuple):
    """One broker's counts for one visit in one batch (a ``broker_visits`` row without its batch id)."""

    night: str
    visit_id: int
    broker: str
    max_alerts_per_visit: int | None
    matched: int
    delivered: int
    dropped_by_cap: int


@dataclass
class CapDecision:
    """One batch's per (broker, visit) counts, before and after the cap."""

    rows: list[BrokerVisit]

    @property
    def delivered_by_broker(self) -> dict[str, int]:
        return self._by_broker("delivered")

    @property
    def dropped_by_broker(self) -> dict[str, int]:
        return self._by_broker("dropped_by_cap")

    def _by_broker(self, field: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.broker] = out.get(row.broker, 0) + getattr(row, field)
        return out

    @property
    def delivered(self) -> int:
        return sum(row.delivered for row in self.rows)


def capped(brokers: list[BrokerSpec]) -> list[tuple[int, BrokerSpec]]:
    """The live brokers with a per-visit cap, with their slots."""
    return [(slot, b) for slot, b in live_brokers(brokers) if b.max_alerts_per_visit is not None]


def slim_steps(columns: list[str], brokers: list[BrokerSpec]) -> list[Step]:
    """Before the caps' window: null the columns (input bytes, verdicts) of alerts no broker matched.

    Only when some broker is capped; the decoded alert's own fields are already
    dropped (``skyfilter/delivery/program.py``).  ``columns`` are the names of
    the matched alerts' columns; the step does not depend on the batch, so it is
    built once.
    """
    if not capped(brokers):
        return []
    needed = any_match(brokers) | ~is_accepted()
    internal = {"kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "night",
                "visit_id", "alert_id", "schema_id", "reject_reason"}
    return [select(*[F.col(f"`{c}`") if c in internal or c.startswith("_matched_")
                     else F.when(needed, F.col(f"`{c}`")).alias(c) for c in columns])]


def decision_steps(brokers: list[BrokerSpec]) -> list[Step]:
    """The steps adding the ``kept`` columns, after :func:`slim_steps` and :meth:`VisitCaps.with_delivered_before`.

    What earlier batches delivered comes in a column, so the steps do not
    depend on the batch and are built once.  Each alert's entry of that map is
    looked up once, into a column of its own: every capped broker reads it, and
    a night's map (a few dozen bytes per visit) would otherwise sit in the plan
    once per broker, growing every batch's task binary as the night goes on.
    """
    with_cap = capped(brokers)
    if not with_cap:
        return [keep_every_match_step(brokers)]
    in_visit = (Window.partitionBy("visit_id").orderBy(F.length("alert_id"), "alert_id")
                .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    already = F.try_element_at(F.from_json(F.col(DELIVERED_BEFORE), "map<string,array<int>>"),
                               F.col("visit_id").cast("string"))
    decisions = {}
    for position, (slot, broker) in enumerate(with_cap):
        is_match = F.col(matched_filters(slot)).isNotNull()
        so_far = F.count_if(is_match).over(in_visit)
        sent = F.coalesce(F.try_element_at(F.col(SENT_BEFORE), F.lit(position + 1)), F.lit(0))
        decisions[kept(slot)] = is_match & (so_far <= F.lit(broker.max_alerts_per_visit) - sent)
    for slot, _ in live_brokers(brokers):
        decisions.setdefault(kept(slot), F.col(matched_filters(slot)).isNotNull())
    return [with_columns({SENT_BEFORE: already}), drop(DELIVERED_BEFORE), with_columns(decisions), drop(SENT_BEFORE)]


def realtime_cap_step(brokers: list[BrokerSpec], ledger: str) -> Step:
    """The ``kept`` columns in Real-time Mode: a capped broker's match is kept when the stream's visit cap
    ledger admits it (``skyfilter/spark/jvm/VisitCapLedger.java``: the first matches of a visit to arrive,
    across partitions and restarts); an uncapped broker keeps every match."""
    decisions = {}
    for slot, broker in live_brokers(brokers):
        is_match = F.col(matched_filters(slot)).isNotNull()
        if broker.max_alerts_per_visit is None:
            decisions[kept(slot)] = is_match
        else:
            decisions[kept(slot)] = is_match & F.call_function(
                VISIT_CAP_FUNCTION, F.lit(ledger), F.lit(broker.name), F.col("night"), F.col("visit_id"),
                F.col("alert_id"), F.lit(int(broker.max_alerts_per_visit)))
    return with_columns(decisions)


def realtime_broker_visits(counts: list[tuple[str, int | None, str, int, int]], brokers: list[BrokerSpec]
                           ) -> CapDecision:
    """The ledger's counts since the last checkpoint, (night, visit, broker, matched, admitted), as the
    ``broker_visits`` rows of capped brokers."""
    caps = {b.name: b.max_alerts_per_visit for b in brokers}
    return CapDecision([BrokerVisit(night, visit, broker, caps.get(broker), matched, admitted, matched - admitted)
                        for night, visit, broker, matched, admitted in sorted(counts, key=str)])


class VisitCaps:
    """What each capped broker already received per visit, and the cap applied to each batch."""

    def __init__(self):
        self.delivered: dict[tuple[str, int], int] = {}
        self.nights: dict[int, str] = {}

    def decide(self, matched: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
        """Add each live broker's ``kept`` column to alerts carrying their broker matches.

        Without capped brokers this is a projection; with them, one window
        over each visit (a shuffle inside the same job).  The bytes and fields
        of alerts that matched nothing and decoded fine are dropped first, so
        the shuffle carries little more than the matches.
        """
        slim = apply_steps(matched, slim_steps(matched.columns, brokers))
        return apply_steps(self.with_delivered_before(slim, brokers), decision_steps(brokers))

    def with_delivered_before(self, frame: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
        """``frame`` with the column :func:`decision_steps` read: what earlier batches delivered, per visit."""
        already = self.delivered_before(brokers)
        return frame if already is None else frame.withColumn(DELIVERED_BEFORE, F.lit(already))

    def delivered_before(self, brokers: list[BrokerSpec]) -> str | None:
        """Per visit, what each capped broker (in order) already received: the JSON map the plan holds as a literal
        (None when no broker is capped)."""
        with_cap = capped(brokers)
        if not with_cap:
            return None
        names = [b.name for _, b in with_cap]
        visits = {visit for (_, visit) in self.delivered}
        return json.dumps({str(v): [self.delivered.get((n, v), 0) for n in names] for v in sorted(visits)})

    def record(self, brokers: list[BrokerSpec], matched: Counter, nights: dict[int, str]) -> CapDecision:
        """Count a finished batch: per (broker, visit) matched, delivered and dropped; remember what was sent.

        ``matched`` counts the batch's matches per (broker slot, visit) before the caps
        (``skyfilter/delivery/batch_figures.py``), ``nights`` the night of each visit in the batch.
        """
        self.nights.update(nights)
        by_slot = dict(live_brokers(brokers))
        rows = []
        for (slot, visit), count in sorted(matched.items()):
            broker = by_slot[slot]
            cap = broker.max_alerts_per_visit
            already = self.delivered.get((broker.name, visit), 0)
            delivered = count if cap is None else max(0, min(count, cap - already))
            rows.append(BrokerVisit(self.nights.get(visit, ""), visit, broker.name, cap, count, delivered,
                                    count - delivered))
            if cap is not None:
                self.delivered[(broker.name, visit)] = already + delivered
        self._forget_old_nights()
        return CapDecision(rows)

    def restore(self, rows: list[tuple[str, int, str, int]]) -> None:
        """Resume from (night, visit, broker, delivered) rows of earlier batches (the delivery log)."""
        for night, visit, broker, delivered in rows:
            self.nights[visit] = night
            self.delivered[(broker, visit)] = self.delivered.get((broker, visit), 0) + delivered
        self._forget_old_nights()

    def _forget_old_nights(self) -> None:
        recent = set(sorted(set(self.nights.values()), reverse=True)[:RECENT_NIGHTS])
        self.delivered = {k: v for k, v in self.delivered.items() if self.nights.get(k[1]) in recent}
        self.nights = {visit: night for visit, night in self.nights.items() if night in recent}

