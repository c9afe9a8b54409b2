"""The delivery log: what the delivery lanes sent, as JSON records on a Kafka topic of the stream.

Two kinds of record share the topic (``<topic>.delivery-log``):

* ``match``: one per alert that went to at least one broker, written by the
  delivery job itself in the same Kafka write as the broker messages
  (``skyfilter/plan/outgoing.py``): the brokers, the filters, the alert's position;
* ``batch``: one per finished delivery batch, written by the driver: the
  figures of the ``metrics`` table and the per (broker, visit) cap counts.

The delivery lanes never wait for Delta: the archive lane reads this topic
and writes ``matches``, ``metrics`` and ``broker_visits`` exactly once, and a
restarted delivery lane reads back what it already delivered per visit, so
its caps hold across restarts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import client_settings, spark_source_options
from skyfilter.kafka.lag import last_batch

KIND_BATCH = "batch"
MATCH_SCHEMA = ("kind string, lane string, batch_id long, night string, visit_id long, alert_id string, "
                "kafka_topic string, kafka_partition int, kafka_offset long, kafka_timestamp_ms long, "
                "brokers array<struct<broker:string, topic:string, format:string, filters:string, watch:string>>")
BATCH_SCHEMA = ("kind string, stream string, lane string, query_id string, run_id string, batch_id long, "
                "trigger string, started_at_ms double, delivered_at_ms double, finished_at_ms double, "
                "input_alerts long, rejected long, archived long, matches long, "
                "matches_by_broker map<string,long>, matches_by_filter map<string,long>, "
                "filter_errors map<string,string>, latency_p50_ms double, latency_p95_ms double, "
                "latency_p99_ms double, latency_max_ms double, input_rows_per_second double, "
                "processed_rows_per_second double, kafka_lag map<string,long>, quarantined_filters array<string>, "
                "broker_visits array<struct<night:string, visit_id:long, broker:string, max_alerts_per_visit:long, "
                "matched:long, delivered:long, dropped_by_cap:long>>")
RESTORE_HOURS = 48  # a cap is restored from this much of the log: a visit never spans longer


def checkpoint_query_id(checkpoint: Path) -> str | None:
    """The id Spark keeps for a streaming query in its checkpoint (stable across restarts)."""
    try:
        return json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


class SummaryWriter:
    """Writes one ``batch`` record per finished delivery batch (idempotent producer, acks from all replicas)."""

    def __init__(self, cfg: Config, topic: str):
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer(client_settings(cfg, acks="all", log_level=0, **{"enable.idempotence": True,
                                                                                  "linger.ms": 0}))

    def write(self, summary: dict, timeout_s: float = 30.0) -> None:
        """Send a summary and wait for it: the batch is committed only once its record is in Kafka."""
        errors: list[str] = []
        self.producer.produce(self.topic, key=f"{summary['lane']}:{summary['batch_id']}".encode(),
                              value=json.dumps({"kind": KIND_BATCH, **summary}, default=str).encode(),
                              on_delivery=lambda error, _m: errors.append(error.str()) if error else None)
        if self.producer.flush(timeout_s) or errors:
            raise SkyfilterError(f"the summary of {summary['lane']} batch {summary['batch_id']} did not reach "
                                 f"'{self.topic}': {errors[0] if errors else 'timed out'}")

    def close(self) -> None:
        self.producer.flush(10)


def read_log(spark: SparkSession, cfg: Config, topic: str, since_ms: int | None = None) -> DataFrame:
    """The log topic as a batch DataFrame (value, timestamp), optionally from a time on."""
    reader = spark.read.format("kafka").options(**spark_source_options(cfg)).option("subscribe", topic)
    if since_ms is not None:
        reader = reader.option("startingTimestamp", str(since_ms)) \
            .option("startingOffsetsByTimestampStrategy", "latest")
    return reader.load().select(F.col("value").cast("string").alias("json"), F.col("timestamp"))


def batch_records(frame: DataFrame) -> DataFrame:
    """The ``batch`` records of a delivery-log frame (column ``json``), parsed."""
    parsed = F.from_json("json", BATCH_SCHEMA)
    return frame.where(F.get_json_object("json", "$.kind") == KIND_BATCH).select(parsed.alias("b")).select("b.*")


def match_records(frame: DataFrame) -> DataFrame:
    """The ``match`` records of a delivery-log frame (columns ``json`` and ``timestamp``), parsed;
    ``delivered_at`` is the record's own Kafka append time, written with the broker messages."""
    parsed = F.from_json("json", MATCH_SCHEMA)
    return frame.where(F.get_json_object("json", "$.kind") == "match") \
        .select(parsed.alias("m"), F.col("timestamp").alias("delivered_at")).select("m.*", "delivered_at")


def delivered_so_far(spark: SparkSession, cfg: Config, topic: str, lane: str, checkpoint: Path
                     ) -> list[tuple[str, int, str, int]]:
    """(night, visit, broker, delivered) of the committed batches of a lane's checkpoint, from its log.

    A batch that was written but not committed runs again after a restart and
    decides the same way, so only committed batches count (each once).
    """
    query_id, committed = checkpoint_query_id(checkpoint), last_batch(checkpoint / "commits")
    if query_id is None or committed is None:
        return []
    since = int((time.time() - RESTORE_HOURS * 3600) * 1000)
    summaries = (batch_records(read_log(spark, cfg, topic, since))
                 .where((F.col("lane") == lane) & (F.col("query_id") == query_id) & (F.col("batch_id") <= committed))
                 .dropDuplicates(["batch_id"]))
    rows = (summaries.select(F.explode("broker_visits").alias("v")).select("v.*")
            .where(F.col("max_alerts_per_visit").isNotNull())
            .groupBy("night", "visit_id", "broker").agg(F.sum("delivered").alias("delivered")).collect())
    return [(r.night, r.visit_id, r.broker, r.delivered) for r in rows]
