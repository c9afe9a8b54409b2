"""SIGTERM and SIGINT to a running stream job: the first asks for a clean stop, a second one while it stops ends it.

A clean stop lets the batch under way finish and the archive catch up with what
was delivered; the job's main loop acts on :attr:`StopSignals.received`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """The job's handlers of SIGTERM and SIGINT, and the handlers they replaced (to give back)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first stop signal that came
        self.previous: dict = {}

    def catch(self) -> None:
        """From now on SIGTERM/SIGINT only note a stop request (outside the main thread Python cannot catch them)."""
        if self.previous or threading.current_thread() is not threading.main_thread():
            return

        def note(signum, _frame):
            self.received = signum

        self.previous = {s: signal.signal(s, note) for s in SIGNALS}

    def second_stops_at_once(self, archive_only: bool) -> None:
        """While the lanes stop and the archive catches up, another SIGTERM/SIGINT ends the process at once.

        An archive-only job (``--lane archive``, as a job's archive process) ignores a second SIGTERM: under
        systemd's default ``KillMode=control-group`` it gets the operator's SIGTERM and then its parent's, and
        must still finish its catch-up (its parent gives it ``archive.stop_timeout_s``); SIGINT still ends it.
        """
        if threading.current_thread() is not threading.main_thread():
            return

        def at_once(signum, _frame):  # print, not logging: a log handler's lock may be held where it interrupts
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
