"""Pinned engine versions (conf/versions.env) and the Spark packages they imply."""

from functools import cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
VERSIONS_FILE = PROJECT_ROOT / "conf" / "versions.env"


@cache
def versions() -> dict[str, str]:
    """All ``KEY=value`` pins from conf/versions.env."""
    pins = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def spark_packages() -> list[str]:
    """Maven coordinates of the Spark connectors: Kafka source/sink, Avro, Delta."""
    v = versions()
    scala, spark = v["SCALA_BINARY_VERSION"], v["SPARK_VERSION"]
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark}",
        f"org.apache.spark:spark-avro_{scala}:{spark}",
        f"io.delta:delta-spark_{scala}:{v['DELTA_VERSION']}",
    ]
