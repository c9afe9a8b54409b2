"""A Spark standalone cluster on this machine: one master and N workers, loopback only.

The daemons are the installed pyspark's own (``bin/spark-class``), so a job
submitted with ``spark-submit --master spark://127.0.0.1:7077`` runs on the
same Spark, connectors and Python as local mode; only the master changes.
Logs, work folders and pid files live under ``<state_dir>/spark/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.versions import PROJECT_ROOT
from skyfilter.local.processes import first_error, free_port, launch, port_in_use, running_pid, terminate

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# skyfilter's own JVM classes (skyfilter/spark/jvm: the visit cap ledger, the log policy every Spark JVM's
# logging uses), built by `make setup`
JVM_JAR = PROJECT_ROOT / ".local" / "jvm" / "skyfilter-spark.jar"


@dataclass(frozen=True)
class Daemon:
    """One master or worker JVM: its name and folder (pid file, log, work dir)."""

    name: str
    folder: Path

    @property
    def pid_file(self) -> Path:
        return self.folder / "daemon.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "daemon.log"

    @property
    def marker(self) -> str:
        """A JVM flag naming this folder: proves a pid is the daemon we started."""
        return f"-Dskyfilter.daemon={self.folder}"

    def pid(self) -> int | None:
        return running_pid(self.pid_file, self.marker)


def spark_home() -> Path:
    """The installed pyspark, which is a complete Spark distribution (bin/, jars/, conf/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkStandalone:
    """The cluster described by the ``spark_cluster.*`` keys of a config."""

    def __init__(self, cfg: Config, workers: int | None = None):
        self.cfg = cfg
        section = cfg.spark_cluster
        self.host = section.host
        self.port = section.master_port
        self.webui_port = section.master_webui_port
        self.workers = int(workers if workers is not None else section.workers)
        if self.workers < 1:
            raise SkyfilterError(f"--workers must be at least 1, got {self.workers}")
        self.worker_cores = section.worker_cores
        self.worker_memory = section.worker_memory
        self.daemon_memory = section.daemon_memory
        self.home = cfg.state_dir / "spark"
        self.master = Daemon("master", self.home / "master")
        self.last_stopped: list[int] = []  # the pids :meth:`stop` stopped last

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def worker_daemons(self) -> list[Daemon]:
        """The configured workers plus any other worker folder found on disk (to stop them all)."""
        wanted = [Daemon(f"worker-{i + 1}", self.home / f"worker-{i + 1}") for i in range(self.workers)]
        found = [Daemon(p.name, p) for p in sorted(self.home.glob("worker-*")) if p not in {w.folder for w in wanted}]
        return wanted + found

    # ----------------------------------------------------------------- start
    def start(self, timeout_s: float = 90.0) -> str:
        """Start the master and the workers that are not running; wait until every worker is ALIVE.

        Returns the master URL.  A taken port, a missing Java or a daemon that
        dies during start-up is a one-line SkyfilterError naming its log.
        """
        if not shutil.which("java"):
            raise SkyfilterError("java not found on PATH: Spark needs a Java 17 runtime")
        launcher = spark_home() / "bin" / "spark-class"
        started = []
        if self.master.pid() is None:
            for port in (self.port, self.webui_port):
                if port_in_use(port, self.host):
                    raise SkyfilterError(f"port {port} on {self.host} is taken (another Spark master?): "
                                         f"choose others with --set spark_cluster.master_port=... / "
                                         f"spark_cluster.master_webui_port=...")
            started.append(self._launch(self.master, [str(launcher), MASTER_CLASS, "--host", self.host, "--port",
                                                      str(self.port), "--webui-port", str(self.webui_port)]))
            self._wait(lambda state: state is not None, started, timeout_s, "the master's web UI to answer")
        for i, worker in enumerate(self.worker_daemons()[:self.workers]):
            if worker.pid() is None:
                command = [str(launcher), WORKER_CLASS, "--host", self.host, "--cores", str(self.worker_cores),
                           "--memory", self.worker_memory, "--webui-port", str(self.webui_port + 1 + i),
                           "--work-dir", str(worker.folder / "work"), self.master_url]
                started.append(self._launch(worker, command))
        self._wait(lambda state: state is not None and state.get("aliveworkers", 0) >= self.workers,
                   started, timeout_s, f"{self.workers} worker(s) to register")
        return self.master_url

    def _launch(self, daemon: Daemon, command: list[str]):
        daemon.folder.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP=self.host,
                   SPARK_DAEMON_MEMORY=self.daemon_memory, SPARK_LOG_DIR=str(daemon.folder),
                   SPARK_DAEMON_JAVA_OPTS=daemon.marker, PYSPARK_PYTHON=sys.executable,
                   SPARK_DAEMON_CLASSPATH=str(JVM_JAR))  # the daemons read the same log4j2.properties
        return daemon, launch(command, daemon.pid_file, daemon.log_file, cwd=daemon.folder, env=env)

    def _wait(self, ready, started, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready(self.state()):
            for daemon, proc in started:
                if proc.poll() is not None:
                    raise SkyfilterError(f"Spark {daemon.name} exited during start-up (code {proc.returncode}): "
                                         f"{first_error([daemon.log_file])}; see {daemon.log_file}")
            if time.monotonic() > deadline:
                raise SkyfilterError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                                     f"see the logs under {self.home}")
            time.sleep(0.5)

    # ------------------------------------------------------------ stop/state
    def stop(self) -> list[int]:
        """Stop the workers, then the master (only daemons this project started). Returns their pids."""
        workers = [pid for pid in (w.pid() for w in self.worker_daemons()) if pid]
        terminate(workers, 20)
        master = [pid for pid in [self.master.pid()] if pid]
        terminate(master, 20)
        for daemon in [self.master, *self.worker_daemons()]:
            daemon.pid_file.unlink(missing_ok=True)
        return workers + master

    def state(self) -> dict | None:
        """The master's own view (its ``/json/`` page: workers, cores, applications), or None if it is down."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=2) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None

    def summary(self) -> str:
        """One line for `skyfilter spark status` and `skyfilter status`."""
        state = self.state()
        if state is None:
            return f"Spark standalone: not running (master {self.master_url})"
        return (f"Spark standalone: master {self.master_url} (UI {self.webui_url}), {state.get('aliveworkers', 0)} "
                f"worker(s) alive, {state.get('coresused', 0)}/{state.get('cores', 0)} cores in use, "
                f"{len(state.get('activeapps', []))} running application(s)")


@contextlib.contextmanager
def cluster_on_free_ports(cfg: Config, state_dir: Path, worker_cores: int | None = None
                          ) -> Iterator[SparkStandalone]:
    """A cluster of ``cfg``'s (2 workers, ``worker_cores`` each if given) beside any other: its own free ports and
    its state under ``state_dir``; stopped by pid at the end (the pids stopped then in ``last_stopped``).  What
    the tests and the benchmarks start."""
    cfg = cfg.with_values({"state_dir": str(state_dir), "spark_cluster.master_port": free_port(17077),
                           "spark_cluster.master_webui_port": free_port(18080),
                           **({} if worker_cores is None else {"spark_cluster.worker_cores": worker_cores})})
    cluster = SparkStandalone(cfg, workers=2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.last_stopped = cluster.stop()
