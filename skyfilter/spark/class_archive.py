"""Spark's classes in a class-data sharing archive, so the JVMs skyfilter starts from Python start sooner.

A Spark driver loads some 20,000 classes before its first job, and parsing and
verifying them is about a third of its start-up (on the project's 2-core
machine: the Spark check 12.6-15.7 s and 16-17 core-s without the archive,
8.5 s and 11.4 core-s with it).  The JVM can instead map them from an archive
written by an earlier run (class-data sharing, ``-XX:SharedArchiveFile``).
``make setup`` writes the archive once, by running the Spark check with
``-XX:ArchiveClassesAtExit``; every JVM that pyspark launches from Python (a
``python pipelines/...`` job, the archive lane's own process, the test
session) then starts with it.

The JVM refuses an archive when a non-empty folder is on its class path, and
Spark puts its conf folder there; so these JVMs get an empty conf folder and
read the same ``spark-defaults.conf`` with ``--properties-file`` and
``log4j2.properties`` by its path.  A driver that ``spark-submit`` starts keeps
pyspark's conf folder and starts without the archive.  An archive that no
longer matches the installed jars is left unused by the JVM (a warning on
standard error) until ``make setup`` writes it again.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skyfilter.core.errors import SkyfilterError
from skyfilter.core.versions import PROJECT_ROOT
from skyfilter.local.spark_cluster import spark_home

CLASS_ARCHIVE = PROJECT_ROOT / ".local" / "jvm" / "spark-classes.jsa"
EMPTY_CONF = PROJECT_ROOT / ".local" / "jvm" / "empty-conf"  # Spark's conf folder on the class path, kept empty
JVM_WARNINGS_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr"  # stdout carries the job's own lines
STEERING = ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT")  # a launch chosen by the user, or done


def spark_conf_folder() -> Path:
    """pyspark's conf folder: the Spark defaults ``make setup`` installed (``.local/spark-conf``)."""
    return (spark_home() / "conf").resolve()


def launch_environment(archive_option: str) -> dict[str, str]:
    """Environment entries that start pyspark's JVM with the Spark defaults read by path, the conf folder on its
    class path empty, and ``archive_option`` (writing or using the class archive)."""
    conf = spark_conf_folder()
    EMPTY_CONF.mkdir(parents=True, exist_ok=True)
    java = [JVM_WARNINGS_TO_STDERR, os.environ.get("SPARK_SUBMIT_OPTS", ""),  # -Xlog:disable before any other
            f"-Dlog4j2.configurationFile={conf / 'log4j2.properties'}", archive_option]
    return {"SPARK_CONF_DIR": str(EMPTY_CONF),
            "PYSPARK_SUBMIT_ARGS": f"--properties-file {shlex.quote(str(conf / 'spark-defaults.conf'))} pyspark-shell",
            "SPARK_SUBMIT_OPTS": " ".join(option for option in java if option)}


def archive_usable() -> bool:
    """Whether a JVM launched from this Python process can start with the archive: it is installed, no JVM is
    running for this process yet, and nobody chose Spark's conf folder or launch arguments themselves."""
    return CLASS_ARCHIVE.is_file() and not set(STEERING) & set(os.environ)


@contextmanager
def with_class_archive() -> Iterator[None]:
    """Inside this block, a JVM pyspark launches starts with the class archive (when :func:`archive_usable`)."""
    if not archive_usable():
        yield
        return
    launch = launch_environment(f"-XX:SharedArchiveFile={CLASS_ARCHIVE}")
    saved = {key: os.environ.get(key) for key in launch}
    os.environ.update(launch)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def write_class_archive(target: Path = CLASS_ARCHIVE) -> str:
    """Run the Spark check in a JVM that writes the classes it loaded to ``target``; returns the check's summary
    and the archive's."""
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = {key: value for key, value in os.environ.items() if key not in STEERING}
    env |= launch_environment(f"-XX:ArchiveClassesAtExit={partial}")
    run = subprocess.run([sys.executable, "-m", "skyfilter.spark.session", "--check"], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0 or not partial.is_file():
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        raise SkyfilterError(f"writing the class archive {target} failed: " + " | ".join(tail))
    partial.replace(target)
    checked = run.stdout.strip().splitlines()[-1]
    return (f"{checked}; class archive {target}: {target.stat().st_size / 2**20:.0f} MB written in "
            f"{time.monotonic() - started:.0f} s")
