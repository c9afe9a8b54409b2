"""`skyfilter kafka start/stop/status`: a real broker comes up, answers, and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import kafka_status_ports, listening_ports, port_base
from skyfilter.local.kafka import free_port_pair
from skyfilter.local.processes import port_in_use

pytestmark = pytest.mark.slow  # every test here runs Kafka clusters or the stream job

CLI = [sys.executable, "-m", "skyfilter.cli"]


def skyfilter(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, env=env)


def kafka_pids(properties_folder: Path) -> list[int]:
    """Pids of JVMs whose command line names a properties file under the folder."""
    pids = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "kafka.Kafka" in cmdline and str(properties_folder) in cmdline:
            pids.append(process.pid)
    return pids


def test_start_status_stop_leaves_no_process(tmp_path):
    port = str(free_port_pair(port_base(27300)))
    where = ["--state-dir", str(tmp_path)]
    started = skyfilter("kafka", "start", *where, "--port", port)
    assert started.returncode == 0, started.stderr
    assert f"bootstrap servers 127.0.0.1:{port}" in started.stdout
    assert len(kafka_pids(tmp_path)) == 1
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5):
        pass
    status = skyfilter("kafka", "status", *where)
    [pid] = kafka_pids(tmp_path)
    assert kafka_status_ports(status.stdout) == {1: (int(port), int(port) + 1)}
    assert listening_ports(pid) == {int(port), int(port) + 1}
    assert f"bootstrap servers 127.0.0.1:{port}" in status.stdout
    # every command finds this Kafka from the state dir alone (its port is not the configured one)
    listed = skyfilter("registry", "list", *where)
    assert listed.returncode == 0 and listed.stdout.strip().endswith(f"at 127.0.0.1:{port}"), listed.stderr
    screen = skyfilter("status", *where)
    assert screen.returncode == 0 and f"127.0.0.1:{port}" in screen.stdout, screen.stdout + screen.stderr
    again = skyfilter("kafka", "start", *where, "--port", port)  # idempotent: already running
    assert again.returncode == 0 and len(kafka_pids(tmp_path)) == 1
    stopped = skyfilter("kafka", "stop", *where)
    assert stopped.returncode == 0 and "stopped 1 Kafka node(s)" in stopped.stdout
    assert kafka_pids(tmp_path) == []
    assert "stopped" in skyfilter("kafka", "status", *where).stdout


def test_port_taken_is_one_clear_line(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = skyfilter("kafka", "start", "--state-dir", str(tmp_path), "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert kafka_pids(tmp_path) == []


def test_a_port_held_by_an_outgoing_connection_counts_as_taken():
    """Ports in the ephemeral range can be the local end of a live connection: Kafka could not bind there."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            local_port = client.getsockname()[1]
            assert port_in_use(local_port) and port_in_use(server.getsockname()[1])
            accepted.close()
    assert not port_in_use(free_port_pair(port_base(27700)))


def test_missing_java_is_one_clear_line(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = skyfilter("kafka", "start", "--state-dir", str(tmp_path), env=env)
    assert result.returncode == 2
    assert "java not found on PATH" in result.stderr and result.stderr.strip().count("\n") == 0


def test_unreachable_kafka_is_one_clear_line(tmp_path):
    port = free_port_pair(port_base(27500))
    result = skyfilter("produce", "--bootstrap", f"127.0.0.1:{port}", "--visits", "1", "--alerts-per-visit", "1",
                       "--set", "state_dir=" + str(tmp_path))
    assert result.returncode == 2
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in result.stderr
    assert result.stderr.strip().count("\n") == 0
