"""``skyfilter status``: one screen for operators: streams, last batch, rates, Kafka lag, cluster."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter status`` to the command's parser."""
    status = commands.add_parser(
        "status", help="one screen for operators: streams, last batch, rates, Kafka lag, cluster",
        description="Read the running streams' status files, their checkpoints and Kafka's latest offsets "
                    "(no Spark needed): each stream's state, last batch, rates, consumer lag per partition, "
                    "totals, quarantined filters and dead letters; then the local Kafka and Spark cluster.")
    status.add_argument("--name", help="only this stream (default: every stream under the state dir)")
    status.add_argument("--wait", type=float, metavar="SECONDS",
                        help="first wait up to SECONDS for the stream (--name, default topics.alerts) to run "
                             "(a stream waits for a producer to register its topic's schema first); exit 1 if it "
                             "does not in time")
    add_config_arguments(status, "the state dir to look in", bootstrap=True)
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter status``; errors raise :class:`SkyfilterError`."""
    from skyfilter.local.status import status_screen

    cfg = config_from_args(args)
    if args.wait is not None:
        from skyfilter.local.status import wait_until_running

        wait_until_running(cfg, args.name or cfg.topics.alerts, args.wait)
    for line in status_screen(cfg, args.name):
        print(line)
    return 0
