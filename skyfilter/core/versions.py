"""Where skyfilter's own files are, the pinned engine versions, and the Spark packages they imply.

The defaults (``local.yaml``) and the version pins (``versions.env``) ship inside the
package (``skyfilter/defaults/``), so an installed skyfilter finds them wherever it is
installed; a checkout shows the same two files as ``conf/local.yaml`` and
``conf/versions.env``.
"""

from functools import cache
from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "defaults"
VERSIONS_FILE = PACKAGE_DATA / "versions.env"


def project_root() -> Path:
    """The checkout skyfilter runs from (the folder holding ``conf/`` beside the package, as in a source tree or
    an editable install), else the working directory: relative paths of the default config start there."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "conf").is_dir() else Path.cwd()


PROJECT_ROOT = project_root()


@cache
def versions() -> dict[str, str]:
    """All ``KEY=value`` pins from versions.env."""
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
