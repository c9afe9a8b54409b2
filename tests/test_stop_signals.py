"""The job's stop signals: a first one asks for a clean stop, its echo changes nothing, a later one ends at once."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import ROOT

SCRIPT = """
import os, signal, sys, time
from skyfilter.jobs import stop_signals
stop_signals.ECHO_S = float(sys.argv[1])
signals = stop_signals.StopSignals()
signals.catch()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
signals.second_stops_at_once(archive_only=False)
os.kill(os.getpid(), signal.SIGTERM)  # spark-submit's copy of the operator's signal, or the operator again
time.sleep(0.5)
print("still stopping cleanly after", signal.Signals(signals.received).name)
"""


def _run(echo_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(echo_s)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_a_signal_soon_after_the_first_is_its_echo():
    result = _run(5.0)
    assert result.returncode == 0 and "still stopping cleanly after SIGTERM" in result.stdout, result.stderr


def test_a_signal_after_the_echo_window_stops_at_once():
    result = _run(0.0)
    assert result.returncode == 128 + signal.SIGTERM and "stopping at once" in result.stderr, result.stdout
