"""Quarantine: a Python filter that raises, or overruns its per-batch time budget, stops running.

It is disabled from the next batch on, while the stream and every other
filter go on.  Each quarantine is recorded three ways: a row in the Delta
``filter_status`` table, one JSON message per subscribing broker on the
errors topic (``topics.errors``: broker, filter, error, a sample alert id),
and the stream's status file read by ``skyfilter filters status``.  A
restarted stream keeps a filter quarantined until its file changes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import asdict, dataclass, replace

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from skyfilter.core.config import Config
from skyfilter.core.figures import FilterReports
from skyfilter.core.filter_loader import FilterProblem
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.topics import ensure_topics
from skyfilter.local.processes import write_whole
from skyfilter.plan.stream_plan import PlanCell, StreamPlan
from skyfilter.plan.tables import append, is_table

logger = logging.getLogger(__name__)

STATUS_SCHEMA = T.StructType([
    T.StructField("stream", T.StringType()), T.StructField("filter", T.StringType()),
    T.StructField("digest", T.StringType()), T.StructField("state", T.StringType()),
    T.StructField("reason", T.StringType()), T.StructField("brokers", T.ArrayType(T.StringType())),
    T.StructField("sample_alert_id", T.StringType()), T.StructField("batch_id", T.LongType()),
    T.StructField("at", T.TimestampType()),
])


@dataclass
class FilterState:
    """What `skyfilter filters status` shows for one filter."""

    name: str
    kind: str
    state: str  # enabled | quarantined | broken | unused
    reason: str = ""
    digest: str = ""


def without_filter(plan: StreamPlan, name: str) -> StreamPlan:
    """``plan`` with filter ``name`` no longer run, nor enabled for any broker."""
    return replace(plan, filters=[f for f in plan.filters if f.name != name],
                   brokers=[replace(b, enabled_filters=[f for f in b.enabled_filters if f != name])
                            for b in plan.brokers])


class Quarantine:
    """Watches each batch's Python filter errors and timings; disables offenders."""

    def __init__(self, spark: SparkSession, cfg: Config, cell: PlanCell):
        self.spark = spark
        self.cfg = cfg
        self.cell = cell
        self.budget = cfg.stream.filter_time_budget_s
        self.errors_topic = cfg.topics.errors
        self.table = cell.current.tables["filter_status"]
        self.states = self._initial_states()
        ensure_topics(cfg, {self.errors_topic: 1})
        self._resume()
        self._save()

    def _initial_states(self) -> dict[str, FilterState]:
        """Every filter file the plan was read from (``unused`` when no broker names it), and the plan's own."""
        specs = self.plan.files.filters
        enabled = {s.name for s in self.plan.filters}
        states = {s.name: FilterState(s.name, s.kind, "enabled" if s.name in enabled else "unused", "", s.digest)
                  for s in specs}
        running = {s.name: s for s in self.plan.filters}
        for name, spec in running.items():  # brokers' watchlist/watchmap subscriptions: filters without a file
            states.setdefault(name, FilterState(name, spec.kind, "enabled", "", spec.digest))
        for problem in self.plan.problems:
            if isinstance(problem, FilterProblem):
                name = problem.path.stem
                kind = "python" if problem.path.suffix == ".py" else "sql"
                reason = f"line {problem.line}: {problem.reason}"
                if name in running:  # a hot reload kept its previous version
                    states[name] = FilterState(name, kind, "enabled", f"previous version runs; file has {reason}",
                                               running[name].digest)
                else:
                    states[name] = FilterState(name, kind, "broken", reason)
        return states

    def refresh(self) -> None:
        """After a hot reload: a quarantined filter stays off until its file changes."""
        old = self.states
        self.states = self._initial_states()
        for name, state in old.items():
            new = self.states.get(name)
            if state.state == "quarantined" and new and new.state == "enabled" and new.digest == state.digest:
                self._disable(name, state.reason)
        self._save()

    def _resume(self) -> None:
        """Keep filters quarantined by an earlier run quarantined, unless their file changed since."""
        if not is_table(self.spark, self.table):
            return
        rows = self.spark.read.format("delta").load(str(self.table)).where(F.col("stream") == self.plan.name) \
            .orderBy("at").collect()
        latest = {row.filter: row for row in rows}
        for name, row in latest.items():
            state = self.states.get(name)
            if row.state == "quarantined" and state and state.state == "enabled" and state.digest == row.digest:
                self._disable(name, f"still quarantined (since batch {row.batch_id}): {row.reason}")
                logger.warning(f"filter '{name}' stays quarantined: its file has not changed since batch "
                               f"{row.batch_id}")

    @property
    def plan(self) -> StreamPlan:
        """The plan in force now."""
        return self.cell.current

    def _disable(self, name: str, reason: str) -> list[str]:
        """Swap in a plan without the filter; returns the brokers that subscribed to it."""
        subscribers = [b.name for b in self.plan.brokers if name in b.enabled_filters]
        self.cell.update(lambda plan: without_filter(plan, name))
        self.states[name].state, self.states[name].reason = "quarantined", reason
        return subscribers

    def held_off(self) -> dict[str, str]:
        """The quarantined filters and the digest of the file each was quarantined with: a reload leaves them
        off until their file changes."""
        return {s.name: s.digest for s in self.states.values() if s.state == "quarantined"}

    def quarantined(self) -> list[str]:
        """The filters quarantined now."""
        return sorted(s.name for s in self.states.values() if s.state == "quarantined")

    def review(self, batch_id: int, reports: FilterReports) -> list[str]:
        """Quarantine every filter that failed or overran in this batch; returns their names."""
        running = {spec.name for spec in self.plan.filters}  # a filter already off is not quarantined twice
        reasons = {name: (f"raised on batch {batch_id}: {error}", reports.samples.get(name))
                   for name, error in reports.errors.items() if name in running}
        for name, seconds in reports.seconds.items():
            if seconds > self.budget and name not in reasons and name in running:
                reasons[name] = (f"took {seconds:.1f} s on batch {batch_id}, over its {self.budget:g} s budget", None)
        if not reasons:
            return []
        now = dt.datetime.now(dt.UTC)
        rows, events = [], []
        for name, (reason, sample) in reasons.items():
            brokers = self._disable(name, reason)
            logger.warning(f"filter '{name}' quarantined from the next batch on: {reason}")
            rows.append((self.plan.name, name, self.states[name].digest, "quarantined", reason, brokers,
                         sample, batch_id, now))
            events += [{"stream": self.plan.name, "broker": broker, "filter": name, "error": reason,
                        "sample_alert_id": sample, "batch_id": batch_id, "time": now.isoformat()}
                       for broker in brokers or [None]]
        append(self.spark.createDataFrame(rows, STATUS_SCHEMA), self.table, f"skyfilter:{self.plan.name}:status",
               batch_id)
        self._publish(events)
        self._save()
        return list(reasons)

    def _publish(self, events: list[dict]) -> None:
        from confluent_kafka import Producer

        producer = Producer(client_settings(self.cfg, acks="all", log_level=3, **{"enable.idempotence": True}))
        for event in events:
            producer.produce(self.errors_topic, key=event["filter"].encode(), value=json.dumps(event).encode())
        if producer.flush(30):
            logger.warning(f"could not publish {len(events)} quarantine event(s) to '{self.errors_topic}'")

    def _save(self) -> None:
        path = self.cfg.filter_states_file(self.plan.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps({"stream": self.plan.name, "updated_at": time.time(), "filters": [
            asdict(s) for s in sorted(self.states.values(), key=lambda s: s.name)]}, indent=1))
