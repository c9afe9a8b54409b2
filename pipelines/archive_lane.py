"""The archive lane: every alert, match and batch figure of a stream, to Delta, exactly once, off the delivery path.

Its own streaming query reads the input topic and the stream's delivery log
(``pipelines/delivery_log.py``) with its own checkpoint and a slower trigger
(``archive.trigger``).  Per batch:

* the input messages are decoded with every field: accepted alerts go to
  ``alerts`` (without images) and ``cutouts``, undecodable ones to ``rejects``,
  each an idempotent append per batch (a retried batch is not archived twice);
* the delivery log's records become ``matches`` (with the time each was
  delivered), ``metrics`` rows of the delivery batches and ``broker_visits``,
  each row inserted only if it is not there yet (a retried delivery batch logs twice);
* one ``metrics`` row of its own, lane ``archive``; with nightly topics on, the
  accepted messages are also copied to ``<topic>.<night>``.

The delivery lane never waits for any of this: a stopped or slow archive lane
catches up from its checkpoint.
"""

from __future__ import annotations

import itertools
import time

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from pipelines.archive import record_schema, split_archive, with_message_hash
from pipelines.decode import is_accepted
from pipelines.delivery_log import batch_records, checkpoint_query_id, match_records
from pipelines.lane import Lane, LaneServices
from pipelines.nightly_topics import NightlyTopics
from pipelines.stream_plan import KAFKA_SOURCE_SCHEMA
from pipelines.tables import METRICS_SCHEMA, append, create_table, insert_new, run_side_by_side

LANE = "archive"
MATCH_KEYS = ["night", "broker", "kafka_topic", "kafka_partition", "kafka_offset"]
METRIC_KEYS = ["lane", "query_id", "batch_id"]
BROKER_VISIT_KEYS = ["query_id", "broker", "visit_id", "batch_id"]
_observation_ids = itertools.count()


class ArchiveLane(Lane):
    """The ``foreachBatch`` function of the archive lane."""

    def __init__(self, services: LaneServices, trigger: str):
        super().__init__(services, LANE)
        plan = services.plan
        self.trigger = trigger
        self.app_id = f"skyfilter:{plan.name}:{LANE}"
        self.nightly = NightlyTopics(plan.cfg, plan.topic, plan.schema) \
            if plan.cfg.get("stream.nightly_topics.enabled", False) else None
        for column in plan.cutouts:  # images never repeat: Parquet's dictionary would only cost time to try
            self.spark.conf.set(f"parquet.enable.dictionary#{column}", "false")

    @property
    def topics(self) -> list[str]:
        """What the lane's query reads."""
        return [self.plan.topic, self.plan.delivery_log_topic]

    def prepare(self) -> None:
        """Create the big tables and record the writer schema before the first alert comes."""
        empty = self.spark.createDataFrame([], KAFKA_SOURCE_SCHEMA)
        alerts, cutouts = self._archive_frames(with_message_hash(self.plan.decode_full(empty)), 0)
        record_schema(self.spark, self.plan.tables["schemas"], self.plan.schema_id, self.plan.schema_json)
        for frame, table in ((alerts, "alerts"), (cutouts, "cutouts")):
            create_table(self.spark, self.plan.tables[table], frame.schema, "night")

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        plan = self.plan
        decoded = with_message_hash(plan.decode_full(batch.where(F.col("topic") == plan.topic)))
        logged = batch.where(F.col("topic") == plan.delivery_log_topic) \
            .select(F.col("value").cast("string").alias("json"), "timestamp").persist()
        try:
            observation = Observation(f"archive_{next(_observation_ids)}")
            matches = self._matches(logged)
            summaries = batch_records(logged)
            tasks = self._appends(decoded, observation, batch_id)
            tasks.append(lambda: insert_new(matches, plan.tables["matches"], MATCH_KEYS, self.app_id, batch_id,
                                            "night"))
            tasks.append(lambda: insert_new(_broker_visits(summaries), plan.tables["broker_visits"],
                                            BROKER_VISIT_KEYS, self.app_id, batch_id, "night"))
            run_side_by_side(tasks)
            stats = self._stats(decoded, observation)
            if stats["rejected"]:
                self._append_rejects(decoded, batch_id)
            if self.nightly is not None and stats["nights"]:
                self.nightly.write(decoded.where(is_accepted()), self.kafka_options, stats["nights"])
            matched = matches.count()
            finished = time.time()
            figures = self.monitor.batch_figures(LANE, batch_id, started, finished, stats["input_alerts"], [])
            own = self._metrics_row(batch_id, started, finished, stats, matched, figures)
            insert_new(_metrics(summaries).unionByName(own), plan.tables["metrics"], METRIC_KEYS, self.app_id,
                       batch_id)
        finally:
            logged.unpersist()
        self._report(batch_id, started, finished, stats, matched, figures)

    def _stats(self, decoded: DataFrame, observation: Observation) -> dict:
        """Counts, nights and input append times of the batch's messages, as the alerts append observed them.

        A batch retried after a crash may find its alerts already committed: Delta then skips the append,
        nothing is observed, and the figures take a pass of their own.
        """
        if observation._jo.future().isCompleted():
            row = observation.get
        else:
            row = decoded.agg(*archive_figures()).first().asDict()
        return {"input_alerts": row["input"], "rejected": row["rejected"], "archived": row["input"] - row["rejected"],
                "appended_ms": row["q"] or [None, None, None], "first_ms": row["first"],
                "nights": sorted(night for night in row["nights"] if night)}

    def _archive_frames(self, decoded: DataFrame, batch_id: int) -> tuple[DataFrame, DataFrame]:
        """The alerts and cutouts rows of a batch's accepted messages."""
        accepted = decoded.where(is_accepted()).drop("reject_reason")
        alerts, cutouts = split_archive(accepted, self.plan.cutouts)
        return alerts.withColumn("batch_id", F.lit(batch_id).cast("long")), cutouts

    def _appends(self, decoded: DataFrame, observation: Observation, batch_id: int) -> list:
        """The idempotent appends of the batch's accepted alerts, each reading the batch itself (nothing cached:
        a second read of the Kafka rows costs less than caching a batch with its images).  The alerts append
        observes the batch's figures."""
        tables = self.plan.tables
        alerts, _ = self._archive_frames(decoded.observe(observation, *archive_figures()), batch_id)
        _, cutouts = self._archive_frames(decoded, batch_id)
        return [lambda: append(alerts, tables["alerts"], self.app_id, batch_id, "night"),
                lambda: append(cutouts, tables["cutouts"], self.app_id, batch_id, "night")]

    def _append_rejects(self, decoded: DataFrame, batch_id: int) -> None:
        """The batch's undecodable messages, with their bytes and reason, appended once."""
        rejects = decoded.where(~is_accepted()).select(
            "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value",
            "schema_id", "reject_reason", F.lit(batch_id).cast("long").alias("batch_id"))
        append(rejects, self.plan.tables["rejects"], self.app_id, batch_id)

    def _matches(self, logged: DataFrame) -> DataFrame:
        """The ``matches`` rows of the log's match records: one per (alert, broker), with its delivery time."""
        records = match_records(logged)
        return records.select("*", F.explode("brokers").alias("b")).select(
            "night", "visit_id", "alert_id", F.col("b.broker").alias("broker"), F.col("b.topic").alias("topic"),
            F.split("b.filters", ",").alias("filters"), F.col("b.format").alias("format"), "kafka_topic",
            "kafka_partition", "kafka_offset", F.timestamp_millis("kafka_timestamp_ms").alias("kafka_timestamp"),
            "delivered_at", "lane", "batch_id")

    def _metrics_row(self, batch_id: int, started: float, finished: float, stats: dict, matched: int,
                     figures: dict) -> DataFrame:
        """This batch's own ``metrics`` row: latency here is input append time to archived."""
        (p50, p95, p99), slowest = archive_latency(stats, finished)
        row = (self.plan.name, self.monitor.run_id, batch_id, self.trigger, _ts(started), None, _ts(finished),
               stats["input_alerts"], stats["rejected"], stats["archived"], matched, {}, {}, {}, None,
               (finished - started) * 1000, p50, p95, p99, slowest, figures["input_rows_per_second"],
               figures["processed_rows_per_second"], figures["kafka_lag"], [], LANE,
               checkpoint_query_id(self.plan.lane_checkpoint(LANE)))
        return self.spark.createDataFrame([row], METRICS_SCHEMA)

    def _report(self, batch_id: int, started: float, finished: float, stats: dict, matched: int,
                figures: dict) -> None:
        quantiles, slowest = archive_latency(stats, finished)
        self.monitor.observe_archive(batch_id, stats, figures, started, finished, quantiles, slowest)
        self.totals.add_archive(stats["archived"], finished)
        if stats["input_alerts"] or matched:
            self.log(f"archive batch {batch_id}: {stats['archived']} alerts archived, {stats['rejected']} rejected, "
                     f"{matched} matches logged, done in {finished - started:.2f} s")


def archive_figures() -> list:
    """The aggregates an archive batch observes over its input messages."""
    accepted = is_accepted()
    millis = F.unix_millis("kafka_timestamp").cast("double")
    return [F.count(F.lit(1)).alias("input"), F.count_if(~accepted).alias("rejected"),
            F.percentile_approx(F.when(accepted, millis), [0.01, 0.05, 0.5], 10000).alias("q"),
            F.min(F.when(accepted, millis)).alias("first"),
            F.collect_set(F.when(accepted, F.col("night"))).alias("nights")]


def archive_latency(stats: dict, finished: float) -> tuple[list, float | None]:
    """([p50, p95, p99], max) in ms from the input append times of a batch's alerts to ``finished``."""
    ended_ms = finished * 1000.0
    quantiles = [None if q is None else ended_ms - q for q in reversed(stats["appended_ms"])]
    return quantiles, None if stats["first_ms"] is None else ended_ms - stats["first_ms"]


def _metrics(summaries: DataFrame) -> DataFrame:
    """``metrics`` rows of the delivery lanes' batch summaries."""
    def ts(column: str):
        return F.timestamp_millis(F.col(column).cast("long"))

    columns = {field.name: F.col(field.name) for field in METRICS_SCHEMA.fields}
    columns.update({"started_at": ts("started_at_ms"), "delivered_at": ts("delivered_at_ms"),
                    "finished_at": ts("finished_at_ms"),
                    "deliver_ms": F.col("delivered_at_ms") - F.col("started_at_ms"),
                    "processing_ms": F.col("finished_at_ms") - F.col("started_at_ms"),
                    "kafka_lag": F.transform_keys("kafka_lag", lambda partition, _: partition.cast("int"))})
    return summaries.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in METRICS_SCHEMA.fields])


def _broker_visits(summaries: DataFrame) -> DataFrame:
    """``broker_visits`` rows of the delivery lanes' batch summaries (capped brokers and uncapped alike)."""
    return summaries.select("query_id", "batch_id", F.explode("broker_visits").alias("v")).select(
        "v.night", "v.visit_id", "v.broker", "v.max_alerts_per_visit", "v.matched", "v.delivered",
        "v.dropped_by_cap", "batch_id", "query_id")


def _ts(seconds: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC)
