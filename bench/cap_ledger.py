"""What a per-visit cap costs per capped alert: in the driver's JVM (local master) and over TCP (a cluster).

    python -m bench.cap_ledger [--alerts 20000] [--repeats 3]

A capped broker's match is admitted by the stream's visit cap ledger
(``skyfilter/spark/jvm/VisitCapLedger.java``) before its message is written: in
the driver's JVM on a local master; on a cluster, each executor's task thread
asks the driver over one TCP connection of its own, and the driver appends the
admission to the ledger's file before it answers.  Measured:

1. **in the JVM**: a Spark job of ``--alerts`` rows through the ledger's SQL
   function, minus the same job without it (best of ``--repeats``), per alert;
2. **over TCP**: one connection to the driver's ledger server (as a task thread
   holds one), one request per alert, each answered before the next: the round
   trip per admitted alert (each one appended to the file) and per refused one
   (over the cap: nothing written).  The client is Python; an executor's is Java,
   whose own overhead is smaller, so these are upper bounds on loopback.

Writes ``cap_ledger.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
import uuid
from pathlib import Path

from bench.harness import add_common_arguments, runs_table, settings_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cap_ledger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=20000, help="capped alerts per measure (default 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="Spark jobs per variant, the best kept (default 3)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Measure both paths; returns the result files."""
    from bench.harness import driver_and_kafka
    from bench.report import write_results
    from skyfilter.spark.session import get_spark

    spark = get_spark("skyfilter-bench-cap-ledger")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    with driver_and_kafka(spark, None) as memory:
        in_jvm = _in_jvm(spark, args)
        admitted, refused = _over_tcp(spark, args)
    rows = [{"path": "in the driver's JVM (local master)", "alerts": args.alerts,
             "p50_us": None, "p99_us": None, "mean_us": round(in_jvm, 2)},
            {"path": "over TCP, admitted (appended to the file)", "alerts": args.alerts, **_summary(admitted)},
            {"path": "over TCP, refused (over the cap)", "alerts": args.alerts, **_summary(refused)}]
    columns = [("path", "path"), ("alerts", "alerts"), ("mean_us", "mean µs per alert"), ("p50_us", "p50 µs"),
               ("p99_us", "p99 µs")]
    notes = [f"In the JVM: a Spark job of {args.alerts} rows through skyfilter_visit_cap, minus the same job "
             f"without it, best of {args.repeats}.",
             "Over TCP: one connection to the driver's ledger server on loopback, each request answered before the "
             "next (a task thread's pattern); the client is Python, an executor's is Java.",
             "Only matches of capped brokers pay this; an alert no capped broker matched asks nothing."]
    return write_results(args.results, "cap_ledger", "What a per-visit cap costs per capped alert", rows, columns,
                         notes, settings_of(args), args.command, _plot(admitted, refused), memory.peaks(),
                         runs_table(args), memory.peak_breakdown())


def _in_jvm(spark, args: argparse.Namespace) -> float:
    """Microseconds per alert the ledger's SQL function adds to a Spark job on this (local) master."""
    from pyspark.sql import functions as F

    from skyfilter.spark.internals import close_visit_caps, open_visit_caps, register_jvm_function

    register_jvm_function(spark, "VisitCapLedger")
    ledger = f"bench-{uuid.uuid4().hex[:8]}"
    open_visit_caps(spark, ledger, str(args.state_dir / f"{ledger}.ledger"), 0)
    rows = spark.range(args.alerts).select(F.col("id").cast("string").alias("alert_id"),
                                           (F.col("id") % 100).alias("visit_id"))
    try:
        best = {}
        for capped in [False, True] * max(1, args.repeats):
            frame = rows.where(F.call_function("skyfilter_visit_cap", F.lit(ledger), F.lit("b"), F.lit("night"),
                                               "visit_id", F.concat(F.lit(uuid.uuid4().hex), "alert_id"),
                                               F.lit(args.alerts))) if capped else rows.where(F.lit(True))
            began = time.perf_counter()
            frame.write.format("noop").mode("overwrite").save()
            best[capped] = min(best.get(capped, float("inf")), time.perf_counter() - began)
    finally:
        close_visit_caps(spark, ledger)
    return max(0.0, best[True] - best[False]) / args.alerts * 1e6


def _over_tcp(spark, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Round trips (µs) of admitted and of refused requests on one connection to the driver's ledger server."""
    from skyfilter.spark.internals import close_visit_caps, open_visit_caps, serve_visit_caps

    ledger = f"bench-{uuid.uuid4().hex[:8]}"
    open_visit_caps(spark, ledger, str(args.state_dir / f"{ledger}.ledger"), 0)
    address = serve_visit_caps(spark, ledger, "127.0.0.1")
    host_port, token = address.split("@", 1)[1].split("/", 1)
    host, port = host_port.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port))) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            replies = connection.makefile("r", encoding="utf-8")
            connection.sendall(f"{token}\n".encode())
            admitted = _ask(connection, replies, ledger, args.alerts, cap=args.alerts, expect="1")
            refused = _ask(connection, replies, ledger, args.alerts, cap=0, expect="0")
    finally:
        close_visit_caps(spark, ledger)
    return admitted, refused


def _ask(connection: socket.socket, replies, ledger: str, alerts: int, cap: int, expect: str) -> list[float]:
    times, visit = [], uuid.uuid4().hex[:6]
    for i in range(alerts):
        began = time.perf_counter()
        connection.sendall(f"{ledger}\tb\tnight\t{visit}{i % 100}\t{visit}-{i}\t{cap}\n".encode())
        reply = replies.readline().strip()
        times.append((time.perf_counter() - began) * 1e6)
        if reply != expect:
            raise RuntimeError(f"the ledger answered {reply!r} where {expect!r} was due")
    return times


def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"mean_us": round(sum(ordered) / len(ordered), 1), "p50_us": round(ordered[len(ordered) // 2], 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1)}


def _plot(admitted: list[float], refused: list[float]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for label, times in (("admitted (written)", admitted), ("refused", refused)):
        ordered = sorted(times)
        axis.plot([i / len(ordered) * 100 for i in range(len(ordered))], ordered, label=label)
    axis.set_yscale("log")
    axis.set_xlabel("percentile")
    axis.set_ylabel("round trip (µs)")
    axis.set_title("Visit cap ledger over TCP, per capped alert")
    axis.legend()
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.cap_ledger", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
