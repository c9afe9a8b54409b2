"""``skyfilter demo``: run a small simulated night end to end (what `make demo` does)."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter demo`` to the command's parser."""
    demo = commands.add_parser("demo", help="run a small simulated night end to end (what `make demo` does)",
                               description="Start a fresh local Kafka under .local/demo, start the "
                                           "stream job, produce a few visits of alerts with cutouts, wait "
                                           "for the stream to drain, check that the archive holds every alert "
                                           "once and every broker topic what its filters and cap select, print "
                                           "a summary, stop everything.  Exit 1 when anything is missing.")
    demo.add_argument("--visits", type=int, default=3, help="visits of the simulated night (default 3)")
    demo.add_argument("--alerts-per-visit", type=int, default=500,
                      help="alerts per visit, each with its three cutouts (default 500; Rubin's visits hold ~10,000)")
    demo.add_argument("--interval", type=float, default=8.0, dest="interval_s",
                      help="seconds between visits (default 8, faster than Rubin's 39 for a short demo)")
    demo.add_argument("--trigger", default="auto", help="delivery trigger (default auto: Real-time Mode when it can "
                      "serve every broker, else micro-batches back to back)")
    demo.add_argument("--keep", action="store_true", help="leave Kafka running afterwards")
    demo.add_argument("--state-dir", help="the demo's own folder (Kafka, checkpoints, Delta tables), emptied "
                                          "first (default .local/demo)")
    add_config_arguments(demo)
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter demo``; errors raise :class:`SkyfilterError`."""
    from skyfilter.commands.demo_night import run_demo

    return run_demo(config_from_args(args), args)
