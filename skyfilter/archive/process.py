"""The archive lane in a process of its own, beside the delivery lane of the same command.

Both lanes in one JVM share its heap and its garbage collector: the archive
moves every alert with its images (about 1.3 GB per Rubin visit), and each of
its collections pauses delivery's threads too.  On a local master, so that one
command still runs the whole stream, ``filter_stream.py`` starts the archive
as a child ``filter_stream.py --lane archive`` (with the delta-rs writers, the
default, a Python process without a JVM; with Spark's queries, a driver with
its own JVM), at a lower CPU priority (``archive.nice``): the operating system then gives delivery the
cores first, and the archive catches up in the gaps between visits.  Its lines
are relayed to the parent's log; if it dies it is started again and resumes
from its checkpoints; on a clean stop it is told to stop once delivery has
stopped, and it drains what was delivered before exiting.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from skyfilter.lanes.totals import StreamTotals
from skyfilter.local.cpu_share import IdleGroup, group_name, idle_group
from skyfilter.local.processes import lower_priority, wait_for_group

logger = logging.getLogger(__name__)

JOB = "skyfilter.jobs.filter_stream"  # run with python -m: the installed job, wherever the package is
ERROR_LINE = re.compile(r"^filter_stream: error: ")
RUNNING_LINE = re.compile(r"^stream '.*' running: ")
OWN_LINE = re.compile(  # said by the parent too (its start, stop, summary and Kafka's comings and goings)
    r"^(stopping on signal|stream '.*': topic |\d+ delivery batch\(es\), \d+ archive batch\(es\)|"
    r"Kafka at \S+ (is unreachable|is reachable again|does not answer yet|answers)|consumer lag not measured)")
RESTART_DELAY_S = 5.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ArchiveProcess:
    """A child ``filter_stream.py --lane archive`` process: started, watched, restarted, stopped."""

    def __init__(self, arguments: list[str], nice: int, totals: StreamTotals, errors_to: Path,
                 cpu_group: bool = False):
        self.command = [sys.executable, "-m", JOB, *arguments]
        self.errors_to = errors_to  # the child's standard error, whole (Spark's log included)
        self.nice = nice
        self.group: IdleGroup | None = None
        self.priority = f"nice {nice}"  # how the child's CPU priority is lowered, for the start line
        if cpu_group:
            self.group, how = idle_group(group_name("archive"))
            self.priority = (f"an idle cgroup ({how}: {self.group}) and nice {nice}" if self.group is not None
                             else f"nice {nice} (no idle cgroup: {how})")
        self.totals = totals
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.stopping = False
        self.last_error = ""
        self.ready = threading.Event()  # the child's queries run
        self.relays: list[threading.Thread] = []  # pass the child's lines on (and count its batches)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, *extra: str) -> ArchiveProcess:
        """Start the child (it waits for the topic's schema and resumes from its checkpoints)."""
        self.ready.clear()
        self.process = subprocess.Popen(
            [*self.command, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env=child_environment(), preexec_fn=self._in_child)
        self.errors_to.parent.mkdir(parents=True, exist_ok=True)
        self.relays = [threading.Thread(target=self._relay, args=(stream, errors), daemon=True,
                                        name="archive-process-relay")
                       for stream, errors in ((self.process.stdout, False), (self.process.stderr, True))]
        for relay in self.relays:
            relay.start()
        return self

    def _in_child(self) -> None:
        """In the child before it runs: lower its priority, its session's included; die with the parent (a
        killed parent leaves no archive running on its own: the next start would run a second one)."""
        if self.group is not None:
            self.group.join()
        lower_priority(self.nice)
        if sys.platform.startswith("linux"):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def _relay(self, stream, errors: bool) -> None:
        with open(self.errors_to, "a") if errors else contextlib.nullcontext() as saved:
            for line in stream:
                self._relay_line(line.rstrip(), saved)

    def _relay_line(self, line: str, saved) -> None:
        if not line:
            return
        if saved is not None:
            saved.write(line + "\n")
            saved.flush()
            if ERROR_LINE.match(line):
                self.last_error = line
                logger.warning(f"archive lane: {line} (its whole output: {self.errors_to})")
        elif RUNNING_LINE.match(line):
            self.ready.set()
        elif not OWN_LINE.match(line):  # the parent says when it stops and sums up the run itself
            self.totals.count_line(line)
            logger.info(line)

    def wait_until_running(self, timeout_s: float, give_up=lambda: False) -> bool:
        """Block until the child's queries run (its JVM start-up then competes with no delivery batch), it
        exits, ``timeout_s`` passes or ``give_up()`` says so."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.5):
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline or give_up():
                return False
        return True

    def check(self) -> None:
        """Start the child again if it died while the stream runs (it resumes from its checkpoints)."""
        if self.stopping or self.process is None or self.process.poll() is None:
            return
        code = self.process.returncode
        self.restarts += 1
        logger.warning(f"archive lane (pid {self.process.pid}) exited with code {code}"
                       f"{': ' + self.last_error if self.last_error else ''}; restarting it in {RESTART_DELAY_S:.0f} s "
                       f"(delivery is not affected; the archive resumes from its checkpoints)")
        time.sleep(RESTART_DELAY_S)
        self.last_error = ""
        self.start()

    def stop(self, timeout_s: float) -> int | None:
        """Stop the child so that the archive ends holding everything delivered; its exit code.

        A running child is told to stop and archives what was delivered before it exits (exit code 0).  Any
        other ending (it had died, it was still starting when told, its drain failed) is followed by a one-shot
        ``--available-now`` archive run that catches up from the checkpoints, so how the child stopped never
        decides what the archive holds.
        """
        deadline = time.monotonic() + timeout_s
        self.stopping = True
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self._wait(deadline)
        if code != 0:
            logger.warning(f"archive lane (pid {self.process.pid}) ended with code {code} before archiving everything "
                           f"delivered: catching up with a one-shot run")
            self.start("--available-now")
            code = self._wait(deadline)
        if self.group is not None:
            self.group.remove()
        return code

    def _wait(self, deadline: float) -> int:
        """Wait for the child until ``deadline``; then stop it (it resumes from its checkpoints on the next
        start).  Its process group goes with it: no Spark JVM of it outlives it."""
        assert self.process is not None
        try:
            code = self.process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning(f"archive lane (pid {self.process.pid}) still draining at its time limit "
                           f"(archive.stop_timeout_s): stopped; it resumes from its checkpoints on the next start")
            code = None
        if code is not None:  # its JVM ends after it, once its temporary folders are deleted
            wait_for_group(self.process.pid, 15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        code = self.process.wait(30) if code is None else code
        for relay in self.relays:  # its last lines counted before the job sums up
            relay.join(10)
        return code


def child_environment() -> dict[str, str]:
    """This process's environment for the child, without the address of this driver's JVM (under spark-submit
    PySpark would otherwise connect the child to it instead of starting its own)."""
    own = {key: value for key, value in os.environ.items() if not key.startswith("PYSPARK_GATEWAY_")}
    return own | {"PYTHONUNBUFFERED": "1"}
