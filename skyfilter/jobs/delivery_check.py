"""Did every broker get what it should?  A stream's broker topics against its archive, re-filtered in batch.

For every night in the stream's archive, the stream's own filter code runs in one
batch over the archived alerts (as ``replay_night.py`` re-filters), before any cap;
then each broker topic is read as a broker reads it and compared:

* a broker without a cap holds exactly the alerts its filters select, once each;
* a capped broker holds, per visit, ``min(cap, matches)`` of the alerts its filters
  select, once each.  Which ones may differ from a batch's choice: in Real-time
  Mode the first matches of a visit to arrive are kept, across partitions;
* the archive holds every message of the input topic once.

What this compares is the stream against a batch run of the same filters: it
finds alerts lost, duplicated or sent to the wrong broker, not a filter that
says something else than its author meant (the tests compare the filters with
independent evaluations for that).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from skyfilter.archive.night_reader import NightSelection, read_messages
from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.jobs.night_filters import filter_night
from skyfilter.kafka.lag import LatestOffsets
from skyfilter.kafka.read_back import read_topic
from skyfilter.plan.outgoing import keep_every_match, match_rows
from skyfilter.plan.tables import table_paths

logger = logging.getLogger(__name__)

SHOWN_IDS = 3  # alert ids a problem line names (the rest are counted)


@dataclass
class BrokerCheck:
    """What one broker's topic holds against what its filters (and cap) select."""

    broker: str
    topic: str
    cap: int | None
    matched: int = 0        # alerts its filters select, before the cap
    expected: int = 0       # what its topic should hold: the matches, or per visit min(cap, matches)
    delivered: int = 0      # messages in its topic
    missing: list[str] = field(default_factory=list)     # selected alerts it lacks (uncapped brokers)
    unexpected: list[str] = field(default_factory=list)  # alerts it holds that its filters do not select
    duplicated: list[str] = field(default_factory=list)  # alerts it holds more than once
    short_visits: dict[int, tuple[int, int]] = field(default_factory=dict)  # capped: visit -> (held, expected)
    latencies_ms: list[float] = field(default_factory=list)  # input append -> output append, per message

    def problems(self) -> list[str]:
        """One line per kind of shortfall (none: the topic holds what it should)."""
        where = f"broker {self.broker} ({self.topic})"
        lines = []
        if self.missing:
            lines.append(f"{where} lacks {len(self.missing)} of the {self.expected} alerts its filters select "
                         f"({_some(self.missing)})")
        if self.unexpected:
            lines.append(f"{where} holds {len(self.unexpected)} alert(s) its filters do not select "
                         f"({_some(self.unexpected)})")
        if self.duplicated:
            lines.append(f"{where} holds {len(self.duplicated)} alert(s) more than once ({_some(self.duplicated)})")
        if self.short_visits:
            visit, (held, wanted) = next(iter(sorted(self.short_visits.items())))
            lines.append(f"{where} holds other than min(cap {self.cap}, matches) alerts in "
                         f"{len(self.short_visits)} visit(s) (visit {visit}: {held}, expected {wanted})")
        return lines


@dataclass
class DeliveryCheck:
    """The archive and every broker topic of a stream, checked."""

    input_messages: int       # messages of the input topic
    archived_rows: int
    archived_messages: int    # distinct (partition, offset) in the archive
    archived_alerts: int      # distinct alert ids in the archive
    nights: list[str]
    brokers: list[BrokerCheck]

    def problems(self) -> list[str]:
        """One line per shortfall, archive first; empty when everything is where it should be."""
        lines = []
        if not self.input_messages == self.archived_rows == self.archived_messages:
            lines.append(f"the archive holds {self.archived_rows} row(s) of {self.archived_messages} distinct "
                         f"message(s), the input topic {self.input_messages} message(s)")
        return lines + [line for broker in self.brokers for line in broker.problems()]


def check_delivery(spark: SparkSession, cfg: Config, topic: str, name: str, filters_dir: Path,
                   brokers_file: Path) -> DeliveryCheck:
    """Compare the archive of stream ``name`` with its input ``topic``, and each broker topic with what the
    filters of ``filters_dir`` and the brokers of ``brokers_file`` select from the archive."""
    tables = table_paths(cfg, name)
    alerts = spark.read.format("delta").load(str(tables["alerts"]))
    counts = alerts.agg(F.count(F.lit(1)).alias("rows"),
                        F.count_distinct("kafka_partition", "kafka_offset").alias("messages"),
                        F.count_distinct("alert_id").alias("alerts")).first()
    nights = sorted(row.night for row in alerts.select("night").distinct().collect())
    matches: dict[str, dict[str, int]] = defaultdict(dict)  # broker -> alert id -> visit id
    visit_of: dict[str, int] = {}
    brokers: list[BrokerSpec] = []
    for night in nights:
        messages, inputs = read_messages(spark, tables, NightSelection(night))
        selected = filter_night(cfg, messages, inputs, filters_dir, brokers_file)
        brokers = selected.brokers
        visit_of.update({row.alert_id: row.visit_id for row in messages.select("alert_id", "visit_id").collect()})
        for row in match_rows(keep_every_match(selected.matched, brokers), brokers) \
                .select("broker", "alert_id", "visit_id").collect():
            matches[row.broker][row.alert_id] = row.visit_id
    latest = LatestOffsets(cfg)
    try:
        input_messages = sum(latest(topic).values())
    finally:
        latest.close()
    checks = [_check_broker(cfg, broker, matches[broker.name], visit_of) for broker in brokers
              if broker.enabled_filters]
    return DeliveryCheck(input_messages, counts["rows"], counts["messages"], counts["alerts"], nights, checks)


def _check_broker(cfg: Config, broker: BrokerSpec, matched: dict[str, int], visit_of: dict[str, int]) -> BrokerCheck:
    messages = read_topic(cfg, broker.topic)
    held = Counter(message.headers.get("alert_id", "") for message in messages)
    check = BrokerCheck(broker.name, broker.topic, broker.max_alerts_per_visit, matched=len(matched),
                        delivered=len(messages),
                        latencies_ms=[m.latency_ms for m in messages if m.latency_ms is not None])
    check.unexpected = sorted(alert for alert in held if alert not in matched)
    check.duplicated = sorted(alert for alert, times in held.items() if times > 1)
    if broker.max_alerts_per_visit is None:
        check.expected = len(matched)
        check.missing = sorted(alert for alert in matched if alert not in held)
        return check
    per_visit = Counter(matched.values())
    held_per_visit = Counter(visit_of[alert] for alert in held if alert in matched)
    for visit, count in sorted(per_visit.items()):
        wanted = min(broker.max_alerts_per_visit, count)
        check.expected += wanted
        if held_per_visit[visit] != wanted:
            check.short_visits[visit] = (held_per_visit[visit], wanted)
    return check


def _some(alert_ids: list[str]) -> str:
    shown = ", ".join(alert_ids[:SHOWN_IDS])
    return f"e.g. {shown}" + (f" and {len(alert_ids) - SHOWN_IDS} more" if len(alert_ids) > SHOWN_IDS else "")
