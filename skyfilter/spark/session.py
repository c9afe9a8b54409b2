"""The SparkSession every skyfilter job uses, and the Spark defaults `make setup` installs.

Spark settings live in ``conf/spark-defaults.conf``; ``make setup`` writes
them, plus the lines that need absolute paths and pinned versions, to
``.local/spark-conf/`` and points pyspark's ``conf`` folder there.  So
``spark-submit pipelines/filter_stream.py`` and ``python
pipelines/filter_stream.py`` run with the same packages and settings.

``python -m skyfilter.spark.session --install DIR`` resolves the connector
packages once with Spark's own Ivy (into ``.local/ivy``; a ``spark-submit`` of a
script that does nothing, no session) and then pins the resolved jars with
``spark.jars``, so jobs start without resolving anything;
``--check`` proves Kafka, Avro and Delta load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skyfilter.core.errors import SkyfilterError
from skyfilter.core.log import LOG_FILE
from skyfilter.core.versions import PROJECT_ROOT, spark_packages
from skyfilter.local.spark_cluster import JVM_JAR, spark_home
from skyfilter.spark.class_archive import CLASS_ARCHIVE, with_class_archive, write_class_archive

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


IVY_DIR = PROJECT_ROOT / ".local" / "ivy"
JVM_SOURCES = Path(__file__).resolve().parent / "jvm"  # skyfilter's own JVM classes (the visit cap ledger)
SPARK_LOG = LOG_FILE  # Spark's warnings and errors, stack traces included, beside skyfilter's own lines


def write_spark_defaults(target: Path, jars: list[Path] | None = None, python: str = sys.executable) -> Path:
    """Write spark-defaults.conf and log4j2.properties for this checkout into ``target``.

    Without ``jars`` the packages are resolved by Spark's Ivy at start-up;
    with them (the jars Ivy resolved once), jobs start without resolving.
    """
    target.mkdir(parents=True, exist_ok=True)
    if jars:
        packages = [f"spark.jars                                     {','.join(map(str, jars))}"]
    else:
        packages = [f"spark.jars.packages                            {','.join(spark_packages())}",
                    f"spark.jars.ivy                                 {IVY_DIR}"]
    lines = [(PROJECT_ROOT / "conf" / "spark-defaults.conf").read_text().rstrip(), "",
             "# Added by `make setup` (skyfilter/spark/session.py): pinned connector jars and absolute paths.",
             *packages,
             f"spark.scheduler.allocation.file                {PROJECT_ROOT / 'conf' / 'fairscheduler.xml'}",
             # on the class path from the JVM's start: log4j2.properties names its log policy
             f"spark.driver.extraClassPath                    {JVM_JAR}",
             f"spark.executor.extraClassPath                  {JVM_JAR}",
             # one SQL configuration per task instead of one per nested field decoded (spark/jvm/TaskConf.java)
             "spark.plugins                                  skyfilter.TaskConf",
             f"spark.pyspark.python                           {python}",
             f"spark.pyspark.driver.python                    {python}", ""]
    (target / "spark-defaults.conf").write_text("\n".join(lines))
    (target / "log4j2.properties").write_text((PROJECT_ROOT / "conf" / "spark-log4j2.properties").read_text()
                                              .replace("@LOG_FILE@", str(SPARK_LOG)))
    return target / "spark-defaults.conf"


def install(target: Path, check_now: bool = True) -> str:
    """Resolve the connector packages once with Spark's Ivy, then pin the resolved jars; ``check_now``: prove they
    load (writing the class archive runs the same check)."""
    import os
    import shutil
    import subprocess
    import tempfile

    # Ivy copies the resolved jars into jars/ and never removes old ones: an upgrade would pin both versions.
    shutil.rmtree(IVY_DIR / "jars", ignore_errors=True)
    CLASS_ARCHIVE.unlink(missing_ok=True)  # the classes of the jars pinned before
    own = build_jvm_jar()  # first: the logging of every Spark JVM, Ivy's resolution included, uses a class of it
    write_spark_defaults(target)
    with tempfile.TemporaryDirectory() as folder:  # spark-submit resolves the packages, then runs a script
        nothing = Path(folder) / "resolve_only.py"  # that does nothing: no Spark session is started for it
        nothing.write_text("")
        resolve = subprocess.run([str(spark_home() / "bin" / "spark-submit"), str(nothing)], capture_output=True,
                                 text=True, env={**os.environ, "SPARK_HOME": str(spark_home())})
    if resolve.returncode != 0:
        tail = (resolve.stderr or resolve.stdout).strip().splitlines()[-3:]
        raise SkyfilterError("resolving the Spark packages failed: " + " | ".join(tail))
    jars = sorted((IVY_DIR / "jars").glob("*.jar"))
    write_spark_defaults(target, [*jars, own])
    pinned = f"{len(jars)} connector jars and skyfilter's own pinned in {target / 'spark-defaults.conf'}"
    return f"{pinned}; {check()}" if check_now else pinned


def build_jvm_jar(target: Path = JVM_JAR) -> Path:
    """Compile skyfilter's own JVM classes against the installed Spark's jars, into ``target``."""
    import shutil
    import subprocess
    import tempfile
    import zipfile

    javac = shutil.which("javac")
    if javac is None:
        raise SkyfilterError("javac not found: install a JDK 17 (apt-get install openjdk-17-jdk-headless)")
    sources = sorted(JVM_SOURCES.glob("*.java"))
    with tempfile.TemporaryDirectory() as classes:
        built = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", f"{spark_home()}/jars/*",
                                "-d", classes, *map(str, sources)], capture_output=True, text=True)
        if built.returncode != 0:
            raise SkyfilterError(f"compiling {JVM_SOURCES} failed: {built.stderr.strip().splitlines()[0]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: skyfilter\n\n")
            # the classes, and log4j's list of the plugins among them (written by its annotation processor)
            for path in sorted([*Path(classes).rglob("*.class"), *Path(classes).rglob("Log4j2Plugins.dat")]):
                jar.write(path, path.relative_to(classes).as_posix())
    return target


def get_spark(app_name: str = "skyfilter", master: str | None = None, conf: dict | None = None):
    """The active SparkSession, or a new one with the project's defaults.

    Under spark-submit the session already has its packages; from plain
    Python, pyspark starts a JVM that reads the same spark-defaults.conf.
    """
    import os

    from pyspark.sql import SparkSession

    # Python workers run the interpreter the driver runs (the project's venv).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with with_class_archive():
        spark = builder.getOrCreate()
    if DELTA_EXTENSION not in spark.sparkContext.getConf().get("spark.sql.extensions", ""):
        raise SkyfilterError("Spark defaults are not installed (no Delta extension): run `make setup`")
    if under_spark_submit(spark):
        from skyfilter.spark.internals import pass_stop_signals_to

        pass_stop_signals_to(spark, os.getpid())
    return spark


@contextmanager
def scheduler_pool(spark, name: str) -> Iterator[None]:
    """Jobs of a query started inside this block run in FAIR scheduler pool ``name`` (``conf/fairscheduler.xml``)."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
    try:
        yield
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)


def under_spark_submit(spark) -> bool:
    """Whether this Python process is the job spark-submit's JVM runs (the JVM is its parent), rather than a
    Python process that launched its own JVM."""
    import psutil

    from skyfilter.spark.internals import driver_jvm_pid

    if driver_jvm_pid(spark) is not None:
        return False
    parent = psutil.Process().parent()
    return parent is not None and parent.name().startswith("java")


def check() -> str:
    """Start Spark, write and read a Delta table with an Avro round trip; returns a summary."""
    import tempfile

    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    spark = get_spark("skyfilter-check")
    schema = '{"type":"record","name":"r","fields":[{"name":"x","type":"long"}]}'
    with tempfile.TemporaryDirectory() as folder:
        frame = spark.range(3).select(to_avro(F.struct(F.col("id").alias("x")), schema).alias("v"))
        frame.select(from_avro("v", schema).alias("r")).select("r.x").write.format("delta").save(folder)
        rows = spark.read.format("delta").load(folder).count()
    _ = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1").option("subscribe", "x").schema
    return f"Spark {spark.version}: Delta, Avro and Kafka connectors load ({rows} rows round-tripped)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install Spark defaults or check the Spark set-up.")
    parser.add_argument("--install", metavar="DIR",
                        help="resolve the connector packages and write spark-defaults.conf into DIR")
    parser.add_argument("--check", action="store_true", help="start Spark and prove the connectors load")
    parser.add_argument("--class-archive", action="store_true",
                        help="write the archive of Spark's classes that JVMs started from Python start with (its run "
                             "is the --check)")
    args = parser.parse_args(argv)
    try:
        if args.install:
            print(install(Path(args.install), check_now=not args.class_archive))
        if args.check:
            print(check())
        if args.class_archive:
            print(write_class_archive())
    except SkyfilterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
