"""Per-broker caps: at most ``max_alerts_per_visit`` alerts of one visit go to a broker.

Which alerts are kept is deterministic: within a batch, a broker's matches
from one visit are taken in alert id order (numeric order for numeric ids:
shorter ids first, then lexicographic) until the cap is reached; a visit
spread over several batches fills its cap in batch order.  The rest are not
sent, and counted: every batch adds one row per (broker, visit) to the Delta
``broker_visits`` table with the alerts matched, delivered and dropped by
the cap.  A restarted stream reads what was already delivered from that
table, so a cap holds across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.tables import append
from skyfilter.brokers import BrokerSpec

BROKER_VISITS_SCHEMA = T.StructType([
    T.StructField("night", T.StringType()), T.StructField("visit_id", T.LongType()),
    T.StructField("broker", T.StringType()), T.StructField("max_alerts_per_visit", T.LongType()),
    T.StructField("matched", T.LongType()), T.StructField("delivered", T.LongType()),
    T.StructField("dropped_by_cap", T.LongType()), T.StructField("batch_id", T.LongType()),
])
RECENT_NIGHTS = 2  # a visit never spans more than this many nights: older counts are not reloaded


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


class VisitCaps:
    """Applies the brokers' per-visit caps across the batches of a stream."""

    def __init__(self, spark: SparkSession, table: Path | None = None, app_id: str = ""):
        """``table``: the ``broker_visits`` table to resume from and record to (None: a one-off batch)."""
        self.spark = spark
        self.table = table
        self.app_id = app_id
        self.delivered: dict[tuple[str, int], int] = {}
        self._resume()

    def _resume(self) -> None:
        if self.table is None or not (self.table / "_delta_log").exists():
            return
        history = self.spark.read.format("delta").load(str(self.table))
        nights = history.select("night").distinct().orderBy(F.desc("night")).limit(RECENT_NIGHTS)
        rows = (history.join(nights, "night").groupBy("broker", "visit_id")
                .agg(F.sum("delivered").alias("delivered")).collect())
        self.delivered = {(row.broker, row.visit_id): row.delivered for row in rows}

    def apply(self, matches: DataFrame, brokers: list[BrokerSpec]) -> tuple[DataFrame, CapDecision]:
        """The matches that stay within each broker's cap, and the counts to record."""
        caps = {b.name: b.max_alerts_per_visit for b in brokers}
        counts = (matches.groupBy(F.col("match.broker").alias("broker"), "visit_id", "night").count().collect())
        rows, allowed = [], {}
        for row in counts:
            cap = caps.get(row.broker)
            already = self.delivered.get((row.broker, row.visit_id), 0)
            room = row["count"] if cap is None else max(0, min(row["count"], cap - already))
            rows.append(BrokerVisit(row.night, row.visit_id, row.broker, cap, row["count"], room, row["count"] - room))
            if room < row["count"]:
                allowed[f"{row.broker}/{row.visit_id}"] = room
        decision = CapDecision(rows)
        if not allowed:
            return matches, decision
        key = F.concat_ws("/", F.col("match.broker"), F.col("visit_id").cast("string"))
        candidates = matches.where(key.isin(list(allowed))).select(
            F.col("match.broker").alias("broker"), "visit_id", "alert_id").collect()
        by_key: dict[str, list[str]] = {}
        for row in candidates:
            by_key.setdefault(f"{row.broker}/{row.visit_id}", []).append(row.alert_id)
        kept = [f"{k}/{alert_id}" for k, ids in by_key.items()
                for alert_id in sorted(ids, key=lambda i: (len(i), i))[: allowed[k]]]
        # Only the small (broker, visit, alert id) triples reach the driver; the wide rows never move.
        keep = ~key.isin(list(allowed)) | F.concat_ws("/", key, F.col("alert_id")).isin(kept)
        return matches.where(keep), decision

    def record(self, decision: CapDecision, batch_id: int) -> None:
        """Remember what was delivered, and append the batch's counts to ``broker_visits``."""
        for row in decision.rows:
            key = (row.broker, row.visit_id)
            self.delivered[key] = self.delivered.get(key, 0) + row.delivered
        frame = self.spark.createDataFrame([(*row, batch_id) for row in decision.rows], BROKER_VISITS_SCHEMA)
        append(frame, self.table, self.app_id, batch_id, "night")
