"""SIGTERM and SIGINT to a running stream job: the first asks for a clean stop, a second one while it stops ends it.

A clean stop lets the batch under way finish and the archive catch up with what
was delivered; the job's main loop acts on :attr:`StopSignals.received`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT)
ECHO_S = 5.0  # a stop signal this soon after the first is its echo, not a second request


class StopSignals:
    """The job's handlers of SIGTERM and SIGINT, and the handlers they replaced (to give back)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first stop signal that came
        self.received_at = 0.0  # when, on the monotonic clock
        self.previous: dict = {}

    def catch(self) -> None:
        """From now on SIGTERM/SIGINT only note a stop request (outside the main thread Python cannot catch them)."""
        if self.previous or threading.current_thread() is not threading.main_thread():
            return

        def note(signum, _frame):
            if self.received is None:
                self.received, self.received_at = signum, time.monotonic()

        self.previous = {s: signal.signal(s, note) for s in SIGNALS}

    def second_stops_at_once(self, archive_only: bool) -> None:
        """While the lanes stop and the archive catches up, another SIGTERM/SIGINT ends the process at once.

        An archive-only job (``--lane archive``, as a job's archive process) ignores a second SIGTERM: under
        systemd's default ``KillMode=control-group`` it gets the operator's SIGTERM and then its parent's, and
        must still finish its catch-up (its parent gives it ``archive.stop_timeout_s``); SIGINT still ends it.

        A signal within :data:`ECHO_S` of the first is that first one's echo and changes nothing: under
        ``KillMode=control-group`` (and Ctrl-C, which signals the whole process group) the Python job gets
        the signal itself and again from spark-submit's JVM, which passes its own on; on a busy machine the
        JVM's copy can come a second or more later.
        """
        if threading.current_thread() is not threading.main_thread():
            return

        def at_once(signum, _frame):  # print, not logging: a log handler's lock may be held where it interrupts
            if time.monotonic() - self.received_at < ECHO_S:
                return
            print(f"second {signal.Signals(signum).name}: stopping at once; the next start resumes from the "
                  f"checkpoints", file=sys.stderr, flush=True)
            os._exit(128 + signum)

        signal.signal(signal.SIGINT, at_once)
        signal.signal(signal.SIGTERM, signal.SIG_IGN if archive_only else at_once)

    def restore(self) -> None:
        """Give SIGTERM and SIGINT back the handlers they had before :meth:`catch`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}
