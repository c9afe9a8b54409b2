"""``skyfilter filters``: check filters, try one on sample alerts, or show their states in a stream."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter filters`` to the command's parser."""
    filters = commands.add_parser(
        "filters", help="check filters, try one on sample alerts, or show their states in a stream",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="check [FOLDER]   check every *.sql and *.py filter of a folder with the stream's own checks\n"
                    "                 (Spark's parser and analyzer): one line per problem, exit 1 when any;\n"
                    "                 a note for a Python filter naming a whole record (costly to pass).\n"
                    "test NAME        run one filter over sample Avro files (--sample) or an archived night\n"
                    "                 (--night): alerts scanned, matched, match rate, time per alert\n"
                    "                 (p50/p90/p99) and the first matches.\n"
                    "status           each filter's state in a stream (enabled, quarantined, broken, unused).",
        epilog="examples:\n"
               "  skyfilter filters check\n"
               "  skyfilter filters test bright_transient --sample samples/lsst-v10\n"
               "  skyfilter filters test fast_riser --night 2026-11-20 --limit 5000")
    filters.add_argument("action", choices=["check", "test", "status"])
    filters.add_argument("target", nargs="?", metavar="FOLDER|NAME",
                         help="check: filters folder (default: stream.filters_dir); test: the filter's name")
    filters.add_argument("--filters-dir", help="check, test: the filters folder (default: stream.filters_dir)")
    filters.add_argument("--sample", nargs="+", metavar="PATH", help="test: Avro container files or folders")
    filters.add_argument("--night", help="test: an archived night, YYYY-MM-DD, of the stream --name")
    filters.add_argument("--limit", type=int, help="test: at most this many alerts")
    filters.add_argument("--show", type=int, default=5, help="test: how many matches to print (default 5)")
    filters.add_argument("--name", help="status, test --night: the stream's name (default: topics.alerts)")
    source = filters.add_mutually_exclusive_group()
    source.add_argument("--topic", help="check against the schema registered for this topic")
    source.add_argument("--schema", help="check against a schema file (.avsc) or an Avro container file (.avro)")
    add_config_arguments(filters, "status, test --night: the stream's state", bootstrap=True)
    filters.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter filters``; errors raise :class:`SkyfilterError`."""
    from skyfilter.tools.filter_commands import run

    return run(config_from_args(args), args)
