"""What the stream does with each micro-batch, in order of urgency.

1. decode and evaluate every filter once (cached for the steps below);
2. cap each broker's matches per visit (``pipelines/caps.py``), then deliver
   them to the broker topics, and undecodable messages to the dead-letter
   topic, through one Kafka write;
3. archive the accepted alerts, the matches and any rejects to Delta,
   idempotently per batch (``txnAppId``/``txnVersion``), so a retried batch
   is never archived twice;
4. record the batch's metrics (counts, timings, latency percentiles).

Latency here is measured per input alert from its Kafka append time to the
moment the batch's Kafka write was acknowledged (an upper bound of the output
append time; consumers can get the exact figure from the ``input_time``
header and the output message's own timestamp).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from pyspark import InheritableThread, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.archive import record_schema, split_archive, with_message_hash
from pipelines.caps import VisitCaps
from pipelines.decode import is_accepted
from pipelines.fanout import MATCHES, deadletter_messages, evaluate, kafka_messages, match_rows
from pipelines.filter_eval import PYTHON_COLUMN, REPORT_FIELD, filter_column, merge_reports
from pipelines.monitoring import StreamMonitor
from pipelines.nightly_topics import NightlyTopics
from pipelines.quarantine import Quarantine
from pipelines.reload import PlanReloader
from pipelines.stream_plan import KAFKA_SOURCE_SCHEMA, StreamPlan
from pipelines.tables import METRICS_SCHEMA, append


@dataclass
class StreamTotals:
    """Running totals of this run, for the closing summary."""

    batches: int = 0
    input_alerts: int = 0
    rejected: int = 0
    archived: int = 0
    matches_by_broker: Counter = field(default_factory=Counter)
    matches_by_filter: Counter = field(default_factory=Counter)
    dropped_by_cap: Counter = field(default_factory=Counter)
    last_input_at: float = 0.0


class BatchProcessor:
    """The ``foreachBatch`` function of the stream job."""

    def __init__(self, spark: SparkSession, plan: StreamPlan, trigger: str, kafka_options: dict[str, str],
                 monitor: StreamMonitor, log=print, quarantine: Quarantine | None = None,
                 reloader: PlanReloader | None = None):
        self.spark = spark
        self.plan = plan
        self.trigger = trigger
        self.kafka_options = kafka_options
        self.log = log
        self.run_id = uuid.uuid4().hex[:12]
        self.app_id = f"skyfilter:{plan.name}"
        self.totals = StreamTotals()
        self.quarantine = quarantine
        self.reloader = reloader
        self.monitor = monitor
        self.caps = VisitCaps(spark, plan.tables["broker_visits"], self.app_id)
        self.nightly = NightlyTopics(plan.cfg, plan.topic, plan.schema) \
            if plan.cfg.get("stream.nightly_topics.enabled", False) else None

    def warm_up(self) -> None:
        """Start the Python workers and create the Delta tables before the first alert arrives.

        Without this the first visit of a night would wait for both (several seconds).
        """
        probe = self.spark.createDataFrame([(None, None, self.plan.topic, 0, -1, None, 0)], KAFKA_SOURCE_SCHEMA)
        evaluated = evaluate(self.plan.decode(probe), self.plan.filters, self.plan.brokers)
        evaluated.agg(F.count(F.lit(1))).collect()
        empty_alerts, empty_cutouts = self._archive_frames(self._for_cache(evaluated).limit(0), 0)
        empty_metrics = self.spark.createDataFrame([], METRICS_SCHEMA)
        record_schema(self.spark, self.plan.tables["schemas"], self.plan.schema_id, self.plan.schema_json)
        for frame, path, partition in ((empty_alerts, self.plan.tables["alerts"], "night"),
                                       (empty_cutouts, self.plan.tables["cutouts"], "night"),
                                       (empty_metrics, self.plan.tables["metrics"], None)):
            if not (path / "_delta_log").exists():
                writer = frame.write.format("delta").mode("append")
                (writer.partitionBy(partition) if partition else writer).save(str(path))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        if self.reloader is not None and self.reloader.check() and self.quarantine is not None:
            self.quarantine.refresh()
        plan = self.plan
        evaluated = self._for_cache(evaluate(plan.decode(batch), plan.filters, plan.brokers)) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        try:
            matches, capped = self.caps.apply(match_rows(evaluated), plan.brokers)
            outgoing = kafka_messages(matches, plan.encodings).unionByName(
                deadletter_messages(evaluated, plan.deadletter_topic))
            outgoing.write.format("kafka").options(**self.kafka_options).save()
            delivered = time.time()
            stats = self._stats(evaluated, delivered)
            if stats["input_alerts"] == 0:
                return
            stats["matches"] = capped.delivered
            stats["by_broker"] = {b.name: 0 for b in plan.brokers} | capped.delivered_by_broker
            stats["dropped_by_broker"] = {b: n for b, n in capped.dropped_by_broker.items() if n}
            self.totals.last_input_at = delivered
            if self.quarantine is not None:
                self.quarantine.review(batch_id, stats)
            if self.nightly is not None:
                self.nightly.write(evaluated.where(is_accepted()), self.kafka_options)
            self._archive(evaluated, matches, batch_id, stats, capped)
            self._record(batch_id, started, delivered, stats)
        finally:
            evaluated.unpersist()

    def _for_cache(self, evaluated: DataFrame) -> DataFrame:
        """The batch as cached: the message's hash always, its bytes only where they are sent on.

        The bytes repeat the decoded alert, cutouts included, so caching them for
        every alert doubled the cache.  Dead letters and ``full`` brokers send
        them unchanged, and so do nightly topics (every accepted alert).
        """
        hashed = with_message_hash(evaluated)
        if self.nightly is not None:
            return hashed
        needed = ~is_accepted() | F.exists(MATCHES, lambda match: match["format"] == F.lit("full"))
        return hashed.withColumn("kafka_value", F.when(needed, F.col("kafka_value")))

    def _stats(self, evaluated: DataFrame, delivered: float) -> dict:
        """Every per-batch figure in one aggregation over the cached batch."""
        accepted = is_accepted()
        latency = F.lit(delivered * 1000.0) - F.unix_millis("kafka_timestamp").cast("double")
        aggregates = [
            F.count(F.lit(1)).alias("input_alerts"),
            F.count_if(~accepted).alias("rejected"),
            F.percentile_approx(latency, [0.5, 0.95, 0.99], 10000).alias("latency"),
            F.max(latency).alias("latency_max"),
        ]
        python = [spec.name for spec in self.plan.filters if spec.kind == "python"]
        if python:
            aggregates.append(F.collect_list(F.col(PYTHON_COLUMN)[REPORT_FIELD]).alias("python_reports"))
        for spec in self.plan.filters:
            aggregates.append(F.count_if(F.col(filter_column(spec.name))).alias(f"f:{spec.name}"))
        row = evaluated.agg(*aggregates).first().asDict()
        percentiles = row["latency"] or [None, None, None]
        reports = merge_reports(row.get("python_reports") or [])
        return {
            "input_alerts": row["input_alerts"], "rejected": row["rejected"],
            "archived": row["input_alerts"] - row["rejected"],
            "latency": percentiles, "latency_max": row["latency_max"],
            "by_filter": {k[2:]: v for k, v in row.items() if k.startswith("f:")},
            "errors": {name: r["error"] for name, r in reports.items() if r["error"]},
            "samples": {name: r["sample"] for name, r in reports.items() if r["error"] and r["sample"]},
            "seconds": {name: reports.get(name, {}).get("seconds", 0.0) for name in python},
        }

    def _archive_frames(self, evaluated: DataFrame, batch_id: int) -> tuple[DataFrame, DataFrame]:
        """The alerts and cutouts rows of a batch's accepted messages."""
        verdicts = [c for c in evaluated.columns if c.startswith(filter_column(""))]  # the plan may have changed
        internal = [*verdicts, PYTHON_COLUMN, MATCHES, "reject_reason"]
        accepted = evaluated.where(is_accepted()).drop(*internal)
        alerts, cutouts = split_archive(accepted, self.plan.cutouts)
        return alerts.withColumn("batch_id", F.lit(batch_id).cast("long")), cutouts

    def _archive(self, evaluated: DataFrame, matches: DataFrame, batch_id: int, stats: dict, capped) -> None:
        """Append the batch to every table it touches, the tables in parallel.

        Each append is idempotent per batch; they are independent, and most of a
        small append's time is the Delta commit (driver-side), so running them side
        by side shortens a batch (by about a second on small batches).  The batch
        ends only when all are committed: an error in any of them fails the batch,
        which is retried.
        """
        plan = self.plan
        alerts, cutouts = self._archive_frames(evaluated, batch_id)
        tasks = [lambda: append(alerts, plan.tables["alerts"], self.app_id, batch_id, "night"),
                 lambda: append(cutouts, plan.tables["cutouts"], self.app_id, batch_id, "night"),
                 lambda: self.caps.record(capped, batch_id)]
        if stats["matches"]:
            rows = matches.select("night", "visit_id", "alert_id", F.col("match.broker").alias("broker"),
                                  F.col("match.topic").alias("topic"), F.col("match.filters").alias("filters"),
                                  F.col("match.format").alias("format"), "kafka_partition", "kafka_offset",
                                  "kafka_timestamp", F.lit(batch_id).cast("long").alias("batch_id"))
            tasks.append(lambda: append(rows, plan.tables["matches"], self.app_id, batch_id, "night"))
        if stats["rejected"]:
            rejects = evaluated.where(~is_accepted()).select(
                "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value",
                "schema_id", "reject_reason", F.lit(batch_id).cast("long").alias("batch_id"))
            tasks.append(lambda: append(rejects, plan.tables["rejects"], self.app_id, batch_id))
        run_side_by_side(tasks)

    def _record(self, batch_id: int, started: float, delivered: float, stats: dict) -> None:
        finished = time.time()
        p50, p95, p99 = stats["latency"]
        quarantined = [s.name for s in self.quarantine.states.values() if s.state == "quarantined"] \
            if self.quarantine is not None else []
        figures = self.monitor.batch_figures(batch_id, started, finished, stats["input_alerts"], quarantined)
        row = (self.plan.name, self.run_id, batch_id, self.trigger, _ts(started), _ts(delivered), _ts(finished),
               stats["input_alerts"], stats["rejected"], stats["archived"], stats["matches"], stats["by_broker"],
               stats["by_filter"], stats["errors"], (delivered - started) * 1000, (finished - started) * 1000,
               p50, p95, p99, stats["latency_max"], figures["input_rows_per_second"],
               figures["processed_rows_per_second"], figures["kafka_lag"], figures["quarantined_filters"])
        metrics = self.spark.createDataFrame([row], METRICS_SCHEMA)
        append(metrics, self.plan.tables["metrics"], self.app_id, batch_id, merge_schema=True)
        self.monitor.observe(batch_id, stats, figures, started, delivered, finished,
                             [f.name for f in self.plan.filters])
        totals = self.totals
        totals.batches += 1
        totals.input_alerts += stats["input_alerts"]
        totals.rejected += stats["rejected"]
        totals.archived += stats["archived"]
        totals.matches_by_broker.update(stats["by_broker"])
        totals.matches_by_filter.update(stats["by_filter"])
        totals.dropped_by_cap.update(stats["dropped_by_broker"])
        if stats["dropped_by_broker"]:
            self.log(f"batch {batch_id}: over max_alerts_per_visit, not sent: " + ", ".join(
                f"{broker} {count}" for broker, count in sorted(stats["dropped_by_broker"].items())))
        for name, error in stats["errors"].items():
            self.log(f"batch {batch_id}: Python filter '{name}' failed, no matches from it in this batch: {error}")
        if stats["rejected"]:
            self.log(f"batch {batch_id}: {stats['rejected']} message(s) could not be decoded; sent to "
                     f"'{self.plan.deadletter_topic}' and kept with their reason in {self.plan.tables['rejects']}")
        self.log(f"batch {batch_id}: {stats['input_alerts']} alerts, {stats['matches']} matches, "
                 f"delivered in {delivered - started:.2f} s, done in {finished - started:.2f} s, "
                 f"latency p50 {_sec(p50)} p99 {_sec(p99)}")


def run_side_by_side(tasks: list) -> None:
    """Run Spark actions in parallel threads (inheriting the batch's Spark properties); re-raise the first error."""
    errors: list[BaseException] = []

    def guarded(task) -> None:
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the batch's thread below
            errors.append(exc)

    threads = [InheritableThread(target=guarded, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _ts(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _sec(millis: float | None) -> str:
    return "-" if millis is None else f"{millis / 1000:.2f} s"
