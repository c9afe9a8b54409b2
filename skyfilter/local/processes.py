"""Background processes the project starts itself (Kafka nodes, Spark standalone daemons).

Each one is a JVM in its own session, with its pid in a file next to its
logs.  A pid file is trusted only while that pid's command line still names
what the project started (``marker``), so a stale file never makes us signal
someone else's process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil


def launch(command: list[str], pid_file: Path, output: Path, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a detached process with stdout and stderr appended to ``output``; record its pid."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd, env=env)
    pid_file.write_text(str(proc.pid))
    return proc


def lower_priority(nice: int) -> None:
    """Lower the calling process's CPU priority by ``nice`` (0-19), also against processes of other sessions.

    Linux schedules each session as one group (autogroup, on by default): a
    process's nice value weighs only against its own session.  A child started
    in a session of its own (``start_new_session``) and merely niced still
    gets half the machine against its parent's session.  Its session's group
    gets the same nice value, so the parent's session really comes first
    (measured: 50/50 with nice alone, 90/10 with the group niced too).
    """
    if nice <= 0:
        return
    os.nice(nice)
    try:
        Path("/proc/self/autogroup").write_text(str(min(nice, 19)))
    except OSError:
        pass  # not Linux, or autogroup compiled out: nice alone then governs


def write_whole(path: Path, text: str) -> None:
    """Replace a file another process reads (a status file) so that it never sees it half written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def running_pid(pid_file: Path, marker: str) -> int | None:
    """The pid recorded in ``pid_file`` if that process runs and its command line contains ``marker``."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if is_running(pid) and marker in " ".join(command_line(pid)) else None


def is_running(pid: int | None) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie, exited but not yet reaped, has)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_time(pid: int) -> float:
    """When process ``pid`` started (``time.time()`` scale), to the clock tick on Linux.

    psutil counts from the boot time in ``/proc/stat``, whole seconds: up to a second early.
    ``/proc/uptime`` has the time since boot to the hundredth of a second.
    """
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return psutil.Process(pid).create_time()


def command_line(pid: int) -> list[str]:
    """A process's argv ([] once it is gone, or when it may not be read)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def terminate(pids: list[int], timeout: float = 30.0) -> None:
    """SIGTERM every pid at once, then SIGKILL whatever is still there after ``timeout``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        if not wait_for_exit(pid, max(0.5, deadline - time.monotonic())):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_for_exit(pid, 10)


def wait_for_group(pgid: int, timeout: float) -> int:
    """Wait up to ``timeout`` for every process of group ``pgid`` to end; returns how many are still running.

    A Spark JVM whose Python has exited is still deleting its temporary folders (the job's jars, ~95 MB in
    /tmp): killing it then leaves them behind for good.
    """
    def in_group(process: psutil.Process) -> bool:
        try:
            return os.getpgid(process.pid) == pgid
        except OSError:
            return False

    _, alive = psutil.wait_procs([p for p in psutil.process_iter() if in_group(p)], timeout=timeout)
    return len(alive)


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait until a process is gone (reaping it if it is our child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished == pid:
                return True
        except ChildProcessError:
            pass
        if not is_running(pid):
            return True
        time.sleep(0.2)
    return False


def port_holder(port: int) -> str | None:
    """Which process listens on TCP ``port`` ("pid N (name)"), when this user may see it; else None."""
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.laddr and connection.laddr.port == port and connection.status == psutil.CONN_LISTEN \
                    and connection.pid:
                return f"pid {connection.pid} ({psutil.Process(connection.pid).name()})"
    except psutil.Error:
        pass
    return None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could not listen on host:port: something listens there, or a live
    connection holds it as its local port (which a connect-only probe would miss)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does: TIME_WAIT is no obstacle
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(start: int, host: str = "127.0.0.1") -> int:
    """The first port from ``start`` on that a server could listen on."""
    return next(p for p in range(start, start + 500) if not port_in_use(p, host))


def first_error(logs: list[Path], markers: tuple[str, ...] = (" ERROR ",)) -> str:
    """The first error line of a process's logs, so a failed start says why in one line."""
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()[-400:]
        except OSError:
            continue
        for line in lines:
            if any(m in line for m in markers) or line.startswith(("Exception", "Error", "Caused by")):
                return line.strip()[:300]
    return "no error in its logs"
