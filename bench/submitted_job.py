"""The stream job as a benchmark starts it: ``spark-submit pipelines/filter_stream.py`` in a process group of
its own (to kill it whole), optionally on a local standalone cluster the benchmark starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.harness import ROOT


class Job:
    """``spark-submit pipelines/filter_stream.py`` as a process group of its own, its lines kept."""

    def __init__(self, argv: list[str], log_file: Path, submit: tuple[str, ...] = ()):
        spark_submit = Path(sys.executable).parent / "spark-submit"
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "PYTHONUNBUFFERED": "1"}
        self.log_file = log_file
        self.lines: list[str] = []
        self.running_at: float | None = None  # when the job printed its `running:` line (epoch s)
        with log_file.open("a") as handle:
            handle.write(f"$ {' '.join(['spark-submit', *submit])} pipelines/filter_stream.py {' '.join(argv)}\n")
        self.process = subprocess.Popen([str(spark_submit), *submit, str(ROOT / "pipelines" / "filter_stream.py"),
                                         *argv],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        start_new_session=True, cwd=ROOT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with self.log_file.open("a") as handle:
            for line in self.process.stdout:
                if self.running_at is None and " running: " in line:
                    self.running_at = time.time()
                self.lines.append(line.rstrip())
                handle.write(line)
                handle.flush()

    def wait_running(self, timeout_s: float = 600) -> None:
        from skyfilter.core.errors import SkyfilterError

        deadline = time.monotonic() + timeout_s
        while self.running_at is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SkyfilterError(f"the stream job did not run (its output: {self.log_file}): "
                                     f"{self.lines[-3:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)

    def stop(self, timeout_s: float = 900) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


@contextlib.contextmanager
def spark_cluster(cfg, state_dir: Path, worker_cores: int, wanted: bool):
    """A local standalone cluster (master + 2 workers of ``worker_cores``, its state under ``state_dir``),
    stopped by pid at the end; None when it is not ``wanted``."""
    if not wanted:
        yield None
        return
    from skyfilter.local.spark_cluster import cluster_on_free_ports

    with cluster_on_free_ports(cfg, state_dir / "spark-cluster", worker_cores) as standalone:
        yield standalone
