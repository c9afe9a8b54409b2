"""``skyfilter bench``: run one benchmark experiment (results into bench/results)."""

from __future__ import annotations

import argparse
import importlib
import sys

from skyfilter.core.errors import SkyfilterError

BENCHMARKS = {
    "user-path": ("bench.user_path", "the job as operators start it: spark-submit, a new --name on a busy topic"),
    "broker-load": ("bench.broker_load", "a broker-like filter set at Rubin's rate, with and without the archive"),
    "visit-burst": ("bench.visit_burst", "one 10,000-alert visit to its last delivered match"),
    "trigger-sweep": ("bench.trigger_sweep", "latency and throughput per trigger interval at Rubin cadence"),
    "sustained": ("bench.sustained", "lag and memory over a long night; the largest visit kept up with"),
    "grid": ("bench.grid", "DMTN-028 grid: producers x partitions x stamps"),
    "filter-scaling": ("bench.filter_scaling", "throughput with 1 to 250 SQL or Python filters"),
    "side-by-side": ("bench.side_by_side", "raw consume, per-filter processes and skyfilter on one topic"),
    "producer": ("bench.producer_rate", "alerts/s of one Python producer, simulated and real alerts"),
    "catch-up": ("bench.catch_up", "a night's backlog caught up in bounded batches"),
    "stages": ("bench.stages", "each stage of the hot path (read, decode, archive, sink) timed alone"),
    "watchlists": ("bench.watchlists", "delivery latency and memory with a 0 to 10,000,000-source watchlist"),
    "cap-ledger": ("bench.cap_ledger", "what a per-visit cap costs per capped alert, in the JVM and over TCP"),
}


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter bench`` to the command's parser."""
    bench = commands.add_parser(
        "bench", help="run one benchmark experiment (results into bench/results)",
        description="Run a benchmark from bench/: " + "; ".join(f"{name}: {what}" for name, (_, what)
                                                                 in BENCHMARKS.items())
                    + ". Options after the experiment's name go to it (see `skyfilter bench NAME --help`).")
    bench.add_argument("experiment", choices=list(BENCHMARKS), metavar="EXPERIMENT",
                       help=", ".join(BENCHMARKS))
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the experiment's own options")
    bench.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter bench``; errors raise :class:`SkyfilterError`."""
    from skyfilter.core.versions import PROJECT_ROOT

    if not (PROJECT_ROOT / "bench").is_dir():
        raise SkyfilterError(f"the benchmarks live in a checkout's bench/ folder, and {PROJECT_ROOT} has none")
    sys.path.insert(0, str(PROJECT_ROOT))  # bench/ is the checkout's, not part of the installed package
    module = BENCHMARKS[args.experiment][0]
    return importlib.import_module(module).main(args.options)
