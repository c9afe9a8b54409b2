"""Python filters in Real-time Mode: worker processes the query calls alert by alert.

Spark 4.2 runs a pandas UDF by streaming rows to a Python worker and reading
its answers only while its input lasts; a Real-time task's input lasts until
the checkpoint, so every answer waited for the checkpoint (measured: a pandas
UDF's rows all left at the batch end, whatever ``maxRecordsPerBatch`` and
``spark.buffer.size``; docs/performance.md).  So the Real-time query calls its
Python filters itself: ``PythonFilterCall.java`` sends each alert's filter
columns, as JSON, to a worker process over a Unix socket and waits for the
verdicts, in the task's own code.

* :class:`FilterWorkers` (driver): starts ``python -m skyfilter.stream.filter_workers``,
  which forks one worker per connection (one per task thread), and writes each
  set of filters the query uses to a file named by its id;
* :func:`serve` and :func:`answer` (workers): the verdicts of one alert, each
  filter called on one-row pandas Series built with Arrow from the Spark
  types (as a pandas UDF would get them), a call longer than the time budget
  interrupted, a filter that failed no longer called by this worker.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skyfilter.stream.filter_eval import FilterSet

PR_SET_PDEATHSIG = 1  # linux/prctl.h
FRAME = struct.Struct(">i")


class FilterWorkers:
    """The filter workers of one stream job: a server process and the filter sets it serves."""

    def __init__(self, log=print):
        self.log = log
        self.folder = Path(tempfile.mkdtemp(prefix="skyfilter-workers-"))  # short: a socket path has 107 bytes
        self.socket = str(self.folder / "workers.sock")
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> FilterWorkers:
        """Start the server; returns once it listens."""
        self.process = subprocess.Popen([sys.executable, "-m", "skyfilter.stream.filter_workers", "--socket",
                                         self.socket], preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Python filter workers did not start (exit code {self.process.poll()})")
            time.sleep(0.05)
        return self

    def publish(self, filters: list[dict], arrow_schema: bytes, budget_s: float) -> FilterSet:
        """Write a set of filters (name, path, source, function, columns as positions) with the Arrow schema of
        their columns, for the workers to load when a request names it."""
        content = json.dumps({"filters": filters, "schema": base64.b64encode(arrow_schema).decode(),
                              "budget_s": budget_s}, sort_keys=True)
        set_id = hashlib.sha256(content.encode()).hexdigest()[:16]
        path = self.folder / f"{set_id}.json"
        if not path.exists():
            partial = path.with_suffix(".partial")
            partial.write_text(content)
            partial.rename(path)
        return FilterSet(self.socket, set_id)

    def close(self) -> None:
        """Stop the server and its workers (they exit when their connection or the server goes)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# ----------------------------------------------------------------------------------------------- the workers
class LoadedSet:
    """A filter set as a worker runs it: the functions, their columns' Arrow types and the time budget."""

    def __init__(self, path: Path):
        import pyarrow as pa

        from skyfilter.core.filter_loader import FilterSpec, filter_function

        content = json.loads(path.read_text())
        self.schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(content["schema"])))
        self.budget_s = content["budget_s"]
        self.filters = []
        for entry in content["filters"]:
            spec = FilterSpec(entry["name"], Path(entry["path"]), "python", entry["source"],
                              function_name=entry["function"])
            self.filters.append((entry["name"], filter_function(spec), entry["positions"]))
        self.failed: set[str] = set()


def column(value, field):
    """One alert's value of a column as the one-row pandas object a pandas UDF gets: a Series, or a DataFrame
    for a record."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_struct(field.type):
        return pd.DataFrame([value or {}], columns=[f.name for f in field.type])
    return pa.array([value], type=field.type).to_pandas()


def answer(request: bytes, folder: Path, sets: dict[str, LoadedSet]) -> str:
    """The verdicts of one request (``<set id>\\n<row JSON>``): one character per filter, then the failures."""
    from skyfilter.stream.filter_eval import time_limit

    set_id, _, payload = request.partition(b"\n")
    key = set_id.decode()
    if key not in sets:
        sets[key] = LoadedSet(folder / f"{key}.json")
    loaded = sets[key]
    row = json.loads(payload)
    values = [column(row.get(f"c{i}"), field) for i, field in enumerate(loaded.schema)]
    verdicts, failures = [], {}
    for name, function, positions in loaded.filters:
        if name in loaded.failed:
            verdicts.append("n")
            continue
        began = time.perf_counter()
        try:
            with time_limit(loaded.budget_s):
                result = function(*[values[i] for i in positions])
            verdict = one_verdict(result)
            verdicts.append("n" if verdict is None else "1" if verdict else "0")
        except Exception as exc:  # noqa: BLE001 - a failing filter must not stop the others
            loaded.failed.add(name)
            verdicts.append("n")
            failures[name] = {"seconds": time.perf_counter() - began, "error": f"{type(exc).__name__}: {exc}",
                              "sample": row.get("alert_id")}
    return "".join(verdicts) + ("\n" + json.dumps(failures) if failures else "")


def one_verdict(result) -> bool | None:
    """A filter's return value for one alert: True, False or None (no verdict); anything that is not one boolean
    (or a sequence of one) raises, as :func:`skyfilter.stream.filter_eval.as_verdict` does for a batch."""
    import numpy as np
    import pandas as pd

    if isinstance(result, pd.DataFrame) or not hasattr(result, "__len__"):
        raise TypeError(f"filter returned {type(result).__name__}, expected a boolean Series")
    if len(result) != 1:
        raise TypeError(f"filter returned {len(result)} values for 1 alerts")
    value = result.iloc[0] if isinstance(result, pd.Series) else result[0]
    if value is None or value is pd.NA:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"filter returned {type(value).__name__} values, expected booleans")


def work(connection: socket.socket, folder: Path) -> None:
    """Answer the requests of one connection until it closes."""
    stream = connection.makefile("rwb", buffering=0)
    sets: dict[str, LoadedSet] = {}
    while True:
        header = _read(stream, FRAME.size)
        if header is None:
            return
        request = _read(stream, FRAME.unpack(header)[0])
        if request is None:
            return
        reply = answer(request, folder, sets).encode()
        stream.write(FRAME.pack(len(reply)) + reply)


def _read(stream, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve(path: str) -> None:
    """Listen on the Unix socket ``path``; fork one worker per connection."""
    import pandas  # noqa: F401 - loaded once here, shared by every forked worker
    import pyarrow  # noqa: F401

    import skyfilter.stream.filter_eval  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped as they exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = path + ".partial"
    listener.bind(partial)
    listener.listen(64)
    os.rename(partial, path)
    folder = Path(path).parent
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                work(connection, folder)
            finally:
                os._exit(0)
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Python filter workers of a Real-time Mode query (started by "
                                                 "the stream job; not run by hand).")
    parser.add_argument("--socket", required=True, help="Unix socket to listen on")
    serve(parser.parse_args(argv).socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
