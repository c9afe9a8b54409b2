"""Python filters in Real-time Mode: worker processes the query calls alert by alert.

Spark 4.2 runs a pandas UDF by streaming rows to a Python worker and reading
its answers only while its input lasts; a Real-time task's input lasts until
the checkpoint, so every answer waited for the checkpoint (measured: a pandas
UDF's rows all left at the batch end, whatever ``maxRecordsPerBatch`` and
``spark.buffer.size``; docs/performance.md).  So the Real-time query calls its
Python filters itself: ``PythonFilterCall.java`` sends each alert's filter
columns, as JSON, to a worker process over a Unix socket and waits for the
verdicts, in the task's own code.  The worker runs beside whichever JVM runs
the task (the driver on a local master, each executor on a cluster): that JVM
starts it on first use (``FilterWorker.java``), and again if it dies.

* :func:`filter_set` and :func:`watch_set` (driver): what the query hands the
  workers, a set's id and content, carried in the query itself (no file has to
  reach the executors);
* :func:`serve` and :func:`answer_all` (the worker process): the verdicts of
  the alerts waiting together (one per busy task: one at a time when alerts
  trickle in, as many as there are tasks in a visit's burst), each filter
  called once on pandas Series built with Arrow from the Spark types (as a
  pandas UDF would get them), a call longer than the time budget interrupted,
  a filter that failed not called again.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import dataclasses
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from skyfilter.filtering.filter_eval import FilterSet

PR_SET_PDEATHSIG = 1  # linux/prctl.h
FRAME = struct.Struct(">i")
# After a request comes, how long the worker waits for the other tasks' before calling the filters: a pandas call
# costs about the same for 1 alert as for 8, so under load fewer, larger calls (docs/performance.md)
LINGER_S = 0.003


FILTERS_ROLE, WATCH_ROLE = "filters", "watch"  # one worker each per JVM: the two run side by side, not in one queue


def filter_set(filters: list[dict], arrow_schema: bytes, budget_s: float, run: str) -> FilterSet:
    """A set of Python filters (name, path, source, function, columns as positions) with the Arrow schema of their
    columns, as the query hands it to the workers of whatever JVM runs its tasks; ``run``: the lane run it
    belongs to (a worker outlives a run: a filter that failed in one is tried afresh in the next)."""
    return _set(FILTERS_ROLE, json.dumps({"filters": filters, "schema": base64.b64encode(arrow_schema).decode(),
                                          "budget_s": budget_s}, sort_keys=True), run)


def watch_set(versions: list, run: str) -> FilterSet:
    """A set of watchlist and watchmap versions (``skyfilter/watch/crossmatch.py``'s ``WatchVersion``) for the
    workers to match alert positions against: a request's row is ``{"ra": .., "dec": ..}``, the reply the flat
    fields as JSON (``skyfilter/watch/columns.py``).  Their files are read where the worker runs: on a
    cluster, from storage every executor shares."""
    return _set(WATCH_ROLE, json.dumps({"watch": [dataclasses.asdict(v) for v in versions]}, sort_keys=True), run)


def _set(role: str, content: str, run: str) -> FilterSet:
    return FilterSet(role, hashlib.sha256(f"{run}\n{content}".encode()).hexdigest()[:16], content)


def _die_with_parent() -> None:
    """End with the JVM that started this worker (a killed executor leaves no worker behind)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # the JVM died before the line above
            sys.exit(0)


# ----------------------------------------------------------------------------------------------- the workers
class LoadedSet:
    """A filter set as the worker runs it: the functions, their columns' Arrow types and the time budget."""

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


class LoadedWatch:
    """A set of watchlist and watchmap versions as the worker matches positions against them."""

    def __init__(self, entries: list[dict]):
        from skyfilter.watch.crossmatch import WatchVersion

        self.versions = tuple(WatchVersion(e["kind"], e["name"], e["version"], tuple(e["files"])) for e in entries)

    def replies(self, rows: list[dict]) -> list[str]:
        """Each alert's flat fields, as JSON."""
        from skyfilter.watch.crossmatch import watch_outputs

        nan = float("nan")
        out = watch_outputs(self.versions, [nan if r.get("ra") is None else r["ra"] for r in rows],
                            [nan if r.get("dec") is None else r["dec"] for r in rows])
        return [json.dumps({name: values[i] for name, values in out.items()}) for i in range(len(rows))]


def load_set(path: Path) -> LoadedSet | LoadedWatch:
    """A published set: filters, or watchlists and watchmaps."""
    content = json.loads(path.read_text())
    return LoadedWatch(content["watch"]) if "watch" in content else LoadedSet(path)


def columns(values: list, field) -> object:
    """The alerts' values of a column as the pandas object a pandas UDF gets for them: a Series, or a DataFrame
    for a record."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_struct(field.type):
        return pd.DataFrame([value or {} for value in values], columns=[f.name for f in field.type])
    return pa.array(values, type=field.type).to_pandas()


def answer_all(requests: list[bytes], folder: Path, sets: dict[str, LoadedSet]) -> list[str]:
    """The replies to requests (``<set id>\n<row JSON>``) waiting together, each filter called once per filter
    set on all of them: one character per filter and alert, then, on the first alert's reply, the failures."""
    replies: list[str] = [""] * len(requests)
    by_set: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        by_set.setdefault(request.partition(b"\n")[0].decode(), []).append(index)
    for key, indexes in by_set.items():
        if key not in sets:
            sets[key] = load_set(folder / f"{key}.json")
        rows = [json.loads(requests[i].partition(b"\n")[2]) for i in indexes]
        for index, reply in zip(indexes, evaluate_rows(sets[key], rows), strict=True):
            replies[index] = reply
    return replies


def answer(request: bytes, folder: Path, sets: dict[str, LoadedSet]) -> str:
    """The reply to one request (see :func:`answer_all`)."""
    return answer_all([request], folder, sets)[0]


def evaluate_rows(loaded: LoadedSet | LoadedWatch, rows: list[dict]) -> list[str]:
    """Every filter of a set on these alerts (renamed ``c<i>`` columns): a verdict string per alert (for a
    watch set, each alert's matches)."""
    from skyfilter.filtering.filter_eval import time_limit

    if isinstance(loaded, LoadedWatch):
        return loaded.replies(rows)

    values = [columns([row.get(f"c{i}") for row in rows], field) for i, field in enumerate(loaded.schema)]
    verdicts = [[] for _ in rows]
    failures = {}
    for name, function, positions in loaded.filters:
        marks = ["n"] * len(rows)
        if name not in loaded.failed:
            began = time.perf_counter()
            try:
                with time_limit(loaded.budget_s):
                    result = function(*[values[i] for i in positions])
                marks = verdict_marks(result, len(rows))
            except Exception as exc:  # noqa: BLE001 - a failing filter must not stop the others
                loaded.failed.add(name)
                failures[name] = {"seconds": time.perf_counter() - began, "error": f"{type(exc).__name__}: {exc}",
                                  "sample": rows[0].get("alert_id")}
        for verdict_list, mark in zip(verdicts, marks, strict=True):
            verdict_list.append(mark)
    replies = ["".join(marks) for marks in verdicts]
    if failures:
        replies[0] += "\n" + json.dumps(failures)
    return replies


def verdict_marks(result, rows: int) -> list[str]:
    """A filter's return value as one mark per alert (``1``, ``0``, ``n`` for no verdict); a plain boolean Series
    of the right length, what nearly every filter returns, without the checks and casts of a general one."""
    import numpy as np
    import pandas as pd

    from skyfilter.filtering.filter_eval import as_verdict

    if isinstance(result, pd.Series | np.ndarray) and result.dtype == np.bool_ and len(result) == rows:
        return ["1" if value else "0" for value in np.asarray(result).tolist()]
    if rows == 1:
        verdict = one_verdict(result)
        return ["n" if verdict is None else "1" if verdict else "0"]
    return ["n" if pd.isna(v) else "1" if v else "0" for v in as_verdict(result, rows).tolist()]


def one_verdict(result) -> bool | None:
    """A filter's return value for one alert: True, False or None (no verdict); anything that is not one boolean
    (or a sequence of one) raises, as :func:`skyfilter.filtering.filter_eval.as_verdict` does for a batch."""
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


def serve(path: str) -> None:
    """Listen on the Unix socket ``path`` and answer every connection, the requests waiting together at once.

    One process: each task thread keeps one request outstanding.  After the first
    request comes, the worker waits up to :data:`LINGER_S` for the other connected
    tasks' (less once every one has sent), so when a visit's burst keeps every task
    busy the filters are called on as many alerts at a time as there are tasks, and
    a lone alert waits that long at most.
    """
    import selectors

    import pandas  # noqa: F401 - loaded before the first request
    import pyarrow  # noqa: F401

    import skyfilter.filtering.filter_eval  # noqa: F401

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = path + ".partial"
    listener.bind(partial)
    listener.listen(64)
    os.rename(partial, path)
    folder = Path(path).parent
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytearray] = {}
    sets: dict[str, LoadedSet] = {}
    while True:
        waiting = _read_ready(selector, listener, buffers, None)
        lingered_until = time.monotonic() + LINGER_S
        while waiting and len({connection for connection, _ in waiting}) < len(buffers) \
                and (left := lingered_until - time.monotonic()) > 0:
            waiting += _read_ready(selector, listener, buffers, left)
        if waiting:
            replies = answer_all([request for _, request in waiting], folder, sets)
            for (connection, _), reply in zip(waiting, replies, strict=True):
                encoded = reply.encode()
                connection.sendall(FRAME.pack(len(encoded)) + encoded)


def _read_ready(selector, listener: socket.socket, buffers: dict[socket.socket, bytearray],
                timeout: float | None) -> list[tuple[socket.socket, bytes]]:
    """Accept new connections and read the ones with data (waiting up to ``timeout``, None: until one has some);
    the whole requests that came, with their connection."""
    import selectors

    waiting: list[tuple[socket.socket, bytes]] = []
    for key, _ in selector.select(timeout):
        if key.fileobj is listener:
            connection, _ = listener.accept()
            buffers[connection] = bytearray()
            selector.register(connection, selectors.EVENT_READ)
            continue
        connection = key.fileobj
        data = connection.recv(1 << 20)
        if not data:
            selector.unregister(connection)
            connection.close()
            buffers.pop(connection, None)
            continue
        buffers[connection] += data
        waiting += [(connection, request) for request in _requests(buffers[connection])]
    return waiting


def _requests(buffer: bytearray) -> list[bytes]:
    """The whole requests at the front of a connection's buffer, taken out of it."""
    found = []
    while len(buffer) >= FRAME.size and len(buffer) >= FRAME.size + FRAME.unpack_from(buffer)[0]:
        size = FRAME.unpack_from(buffer)[0]
        found.append(bytes(buffer[FRAME.size:FRAME.size + size]))
        del buffer[:FRAME.size + size]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Python filter workers of a Real-time Mode query (started by "
                                                 "skyfilter's SQL function in the JVM that runs the query's tasks; "
                                                 "not run by hand).")
    parser.add_argument("--socket", required=True, help="Unix socket to listen on")
    _die_with_parent()
    serve(parser.parse_args(argv).socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
