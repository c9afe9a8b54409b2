"""What every lane of a stream job shares: Spark, the plan, the Kafka sink settings, the monitor, the totals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pipelines.monitoring import StreamMonitor
from pipelines.stream_plan import StreamPlan
from pipelines.totals import StreamTotals


@dataclass(frozen=True)
class LaneServices:
    """The pieces of one stream job that its delivery, real-time and archive lanes all use.

    The plan is shared, not copied: hot reload and quarantine change it for every lane at once.
    """

    spark: SparkSession
    plan: StreamPlan
    kafka_options: dict[str, str]  # the Kafka sink's connection settings
    monitor: StreamMonitor
    totals: StreamTotals
    log: Callable[[str], None] = print


class Lane:
    """Base of the lanes: exposes the shared services as attributes.

    Each lane writes to Kafka through its own producer (Spark keeps one per set of
    options, so a lane's ``client.id`` sets it apart): small real-time records never
    queue behind the archive lane's copy of every alert, and brokers can tell the
    lanes apart (metrics, quotas).  The id names the lane only, not the stream, so a
    JVM that runs many streams in turn (benchmarks, tests) keeps three producers.
    """

    def __init__(self, services: LaneServices, name: str):
        self.services = services
        self.spark = services.spark
        self.plan = services.plan
        self.kafka_options = {**services.kafka_options, "kafka.client.id": f"skyfilter-{name}"}
        self.monitor = services.monitor
        self.totals = services.totals
        self.log = services.log

    def warm_up_kafka(self, topics: list[str]) -> None:
        """Load the Kafka producer's classes and fetch the metadata of ``topics`` before the first alert.

        Spark creates a sink's producer on the first record it writes; the first
        time in a JVM that costs a few hundred milliseconds, which the first visit
        of a night would wait for.  A throwaway producer with the sink's settings
        pays it here, without writing anything.
        """
        jvm = self.spark.sparkContext._jvm
        settings = jvm.java.util.Properties()
        for key, value in self.kafka_options.items():
            if key.startswith("kafka."):
                settings.setProperty(key[len("kafka."):], str(value))
        serializer = "org.apache.kafka.common.serialization.ByteArraySerializer"
        settings.setProperty("key.serializer", serializer)
        settings.setProperty("value.serializer", serializer)
        settings.setProperty("max.block.ms", "5000")  # a topic made later (a night's) is not waited for
        producer = jvm.org.apache.kafka.clients.producer.KafkaProducer(settings)
        try:
            for topic in topics:
                try:
                    producer.partitionsFor(topic)
                except Py4JJavaError:
                    pass  # best effort: the sink's own write says what is wrong with a topic
        finally:
            producer.close()

