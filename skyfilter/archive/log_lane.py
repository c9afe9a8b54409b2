"""The archive lane's second query: the delivery log to the ``matches``, ``metrics`` and ``broker_visits`` tables.

It reads the stream's delivery log (``skyfilter/lanes/delivery_log.py``) with its
own checkpoint, on ``archive.log_trigger`` (slower than the alerts query: its
tables are small, and each batch pays a few Delta commits whatever its size).
A delivery batch that was retried logs its records again, possibly in a later
batch of this query: every row is inserted only if it is not there yet
(``skyfilter/archive/insert_once.py``: in the common case, rows above what each
table holds of their source, without reading the table back), and each batch's
inserts are idempotent, so each table holds every row once.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.archive.insert_once import StoredMarks
from skyfilter.core.lane_names import LaneName
from skyfilter.lanes.delivery_log import batch_records, match_records
from skyfilter.lanes.lane import Lane, LaneServices
from skyfilter.plan.tables import METRICS_SCHEMA, run_side_by_side
from skyfilter.watch.columns import WATCH_MATCHES_DDL

logger = logging.getLogger(__name__)

LANE = LaneName.ARCHIVE_LOG
# the keys of each table's rows; the last grows along a source (offsets along input partitions, batch ids along a
# lane's query): see StoredMarks
MATCH_KEYS = ["night", "broker", "kafka_topic", "kafka_partition", "kafka_offset"]
METRIC_KEYS = ["lane", "query_id", "batch_id"]
BROKER_VISIT_KEYS = ["query_id", "broker", "visit_id", "batch_id"]


class ArchiveLogLane(Lane):
    """The ``foreachBatch`` function of the query over the delivery log."""

    def __init__(self, services: LaneServices, trigger: str):
        super().__init__(services, LANE)
        self.trigger = trigger
        self.app_id = f"skyfilter:{services.cell.current.name}:{LANE}"
        tables = self.plan.tables
        self.matches_table = StoredMarks(tables["matches"], MATCH_KEYS, ["kafka_topic", "kafka_partition"], "night")
        self.broker_visits_table = StoredMarks(tables["broker_visits"], BROKER_VISIT_KEYS, ["query_id"], "night")
        self.metrics_table = StoredMarks(tables["metrics"], METRIC_KEYS, ["lane", "query_id"])

    @property
    def topics(self) -> list[str]:
        """What the query reads."""
        return [self.plan.delivery_log_topic]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        logged = batch.select(F.col("value").cast("string").alias("json"), "timestamp").persist()
        try:
            matches, summaries = log_matches(logged), batch_records(logged)
            run_side_by_side([
                lambda: self.matches_table.insert(matches, self.app_id, batch_id),
                lambda: self.broker_visits_table.insert(log_broker_visits(summaries), self.app_id, batch_id),
                lambda: self.metrics_table.insert(log_metrics(summaries), self.app_id, batch_id)])
            is_match = F.get_json_object("json", "$.kind") == "match"
            counts = logged.agg(  # matches: (alert, broker) pairs, as delivered and as stored in `matches`
                F.count(F.lit(1)).alias("records"), F.count_if(~is_match).alias("batches"),
                F.coalesce(F.sum(F.when(is_match, F.json_array_length(F.get_json_object("json", "$.brokers")))),
                           F.lit(0)).alias("matches")).first()
        finally:
            logged.unpersist()
        finished = time.time()
        self.monitor.observe_log(batch_id, counts["records"], started, finished)
        self.totals.add_logged(counts["matches"])
        if counts["records"]:
            logger.info(f"archive log batch {batch_id}: {counts['matches']} matches, {counts['batches']} batch records "
                        f"logged, done in {finished - started:.2f} s")


def log_matches(logged: DataFrame) -> DataFrame:
    """The ``matches`` rows of the log's match records: one per (alert, broker), with its delivery time."""
    records = match_records(logged)
    return records.select("*", F.explode("brokers").alias("b")).select(
        "night", "visit_id", "alert_id", F.col("b.broker").alias("broker"), F.col("b.topic").alias("topic"),
        F.split("b.filters", ",").alias("filters"), F.col("b.format").alias("format"), "kafka_topic",
        "kafka_partition", "kafka_offset", F.timestamp_millis("kafka_timestamp_ms").alias("kafka_timestamp"),
        "delivered_at", "lane", "batch_id", F.from_json("b.watch", WATCH_MATCHES_DDL).alias("watch"))


def log_metrics(summaries: DataFrame) -> DataFrame:
    """``metrics`` rows of the lanes' batch records (delivery, realtime and archive alike)."""
    def ts(column: str):
        return F.timestamp_millis(F.col(column).cast("long"))

    columns = {field.name: F.col(field.name) for field in METRICS_SCHEMA.fields}
    columns.update({"started_at": ts("started_at_ms"), "delivered_at": ts("delivered_at_ms"),
                    "finished_at": ts("finished_at_ms"),
                    "deliver_ms": F.col("delivered_at_ms") - F.col("started_at_ms"),
                    "processing_ms": F.col("finished_at_ms") - F.col("started_at_ms"),
                    "kafka_lag": F.transform_keys("kafka_lag", lambda partition, _: partition.cast("int"))})
    return summaries.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in METRICS_SCHEMA.fields])


def log_broker_visits(summaries: DataFrame) -> DataFrame:
    """``broker_visits`` rows of the delivery lanes' batch records (capped brokers and uncapped alike)."""
    return summaries.select("query_id", "batch_id", F.explode("broker_visits").alias("v")).select(
        "v.night", "v.visit_id", "v.broker", "v.max_alerts_per_visit", "v.matched", "v.delivered",
        "v.dropped_by_cap", "batch_id", "query_id")
