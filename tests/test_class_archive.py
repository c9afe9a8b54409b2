"""JVMs started from Python map Spark's classes from the archive `make setup` writes, with the same settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from skyfilter.spark.class_archive import (
    CLASS_ARCHIVE,
    EMPTY_CONF,
    launch_environment,
    spark_conf_folder,
    with_class_archive,
)

SETTINGS = ("spark.jars", "spark.sql.extensions", "spark.scheduler.mode", "spark.driver.memory")
SHOW = ("import json\n"
        "from skyfilter.spark.session import get_spark\n"
        "spark = get_spark('class-archive', conf={'spark.ui.enabled': 'false'})\n"
        "conf = spark.sparkContext.getConf()\n"
        f"print(json.dumps({{key: conf.get(key) for key in {SETTINGS!r}}}))\n"
        "entries = spark.sparkContext._jvm.System.getProperty('java.class.path').split(':')\n"
        "print(next(e for e in entries if not e.endswith(('.jar', '*'))))\n")  # the conf folder


def _start(tmp_path, name: str, **env: str) -> tuple[dict, str, dict[str, str]]:
    """Start a session in a Python process of its own; its settings, the folder on its class path (Spark's conf
    folder) and its class sources."""
    loaded = tmp_path / f"{name}.classes.log"
    own = {key: value for key, value in os.environ.items() if not key.startswith("PYSPARK_")}
    run = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, timeout=300,
                         env=own | {"SPARK_SUBMIT_OPTS": f"-Xlog:class+load=info:file={loaded}"} | env)
    assert run.returncode == 0, run.stderr[-2000:]
    settings, class_path = run.stdout.splitlines()[-2:]
    sources = dict(line.split("[class,load] ")[1].split(" source: ", 1) for line in loaded.read_text().splitlines()
                   if " source: " in line)
    return json.loads(settings), class_path.rstrip("/"), sources


@pytest.mark.slow  # real Spark, twice; the archive comes with `make setup`
def test_a_jvm_started_from_python_maps_sparks_classes_from_the_archive(tmp_path):
    assert CLASS_ARCHIVE.is_file(), "make setup writes the archive"
    settings, class_path, sources = _start(tmp_path, "archive")
    assert class_path == str(EMPTY_CONF) and not list(EMPTY_CONF.iterdir())
    mapped = [name for name, source in sources.items() if source.startswith("shared objects file")]
    assert len(mapped) > 0.7 * len(sources), f"{len(mapped)} of {len(sources)} classes from the archives"
    assert sources["org.apache.spark.SparkContext"] == "shared objects file (top)"
    assert sources["io.delta.sql.DeltaSparkSessionExtension"] == "shared objects file (top)", "connectors' too"

    # as spark-submit starts a driver (pyspark's conf folder on the class path, no archive): the same settings
    plain_settings, plain_class_path, plain_sources = _start(tmp_path, "plain", SPARK_CONF_DIR=str(spark_conf_folder()))
    assert settings == plain_settings and settings["spark.jars"] and settings["spark.sql.extensions"]
    assert plain_class_path == str(spark_conf_folder())
    assert plain_sources["org.apache.spark.SparkContext"].startswith("file:")


def test_the_archive_is_left_to_whoever_steers_sparks_launch(monkeypatch):
    """A conf folder or launch arguments chosen by the user, or a JVM already running (spark-submit), win."""
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xss4m")
    launch = launch_environment("-XX:SharedArchiveFile=x.jsa")
    assert launch["SPARK_CONF_DIR"] == str(EMPTY_CONF)
    assert launch["PYSPARK_SUBMIT_ARGS"].startswith("--properties-file ") and \
        launch["PYSPARK_SUBMIT_ARGS"].endswith("spark-defaults.conf pyspark-shell")
    java = launch["SPARK_SUBMIT_OPTS"]
    assert " -Xss4m " in java and java.endswith(" -XX:SharedArchiveFile=x.jsa")
    for steering in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT"):
        with monkeypatch.context() as patch:
            patch.setenv(steering, "theirs")
            before = dict(os.environ)
            with with_class_archive():
                assert dict(os.environ) == before
    if CLASS_ARCHIVE.is_file():
        with with_class_archive():
            assert os.environ["SPARK_SUBMIT_OPTS"].endswith(f"-XX:SharedArchiveFile={CLASS_ARCHIVE}")
        assert os.environ["SPARK_SUBMIT_OPTS"] == "-Xss4m" and "SPARK_CONF_DIR" not in os.environ
