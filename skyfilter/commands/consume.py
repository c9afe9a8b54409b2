"""``skyfilter consume``: read a topic decoded through the registry: print JSON lines or write Avro/JSON files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter consume`` to the command's parser."""
    consume = commands.add_parser(
        "consume", help="read a topic decoded through the registry: print JSON lines or write Avro/JSON files",
        description="Read a broker topic (or any topic skyfilter writes) as a community broker would: each "
                    "message decoded in its topic's encoding (Confluent wire format through the output registry, "
                    "Fink's schema-in-key layout, or JSON), printed as one JSON line (position, encoding, schema "
                    "id, headers, alert; bytes fields as their length) or written to "
                    "--output-dir as one Avro container file (with its schema) or JSON file per message.  "
                    "Stops after --max-messages or when nothing came for --idle seconds; a summary goes to "
                    "stderr.")
    consume.add_argument("topic", help="topic to read, e.g. filtered.summaries")
    consume.add_argument("--group", help="consumer group: resume from its committed position and commit "
                                         "(default: a throwaway group, nothing committed)")
    consume.add_argument("--from-beginning", action="store_true", help="start from the earliest message")
    consume.add_argument("--max-messages", type=int, help="stop after this many messages")
    consume.add_argument("--idle", type=float, default=10.0, help="stop after this many seconds without a "
                                                                  "message (default 10)")
    consume.add_argument("--output-dir", type=Path, help="write one file per message here instead of printing")
    consume.add_argument("--format", choices=["json", "avro"], default="json", dest="output_format",
                         help="file format with --output-dir (default json)")
    add_config_arguments(consume, "where the local Kafka runs (its bootstrap servers are found there)", bootstrap=True)
    consume.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter consume``; errors raise :class:`SkyfilterError`."""
    from skyfilter.tools.consume import ConsumeOptions, consume

    options = ConsumeOptions(topic=args.topic, group=args.group, from_beginning=args.from_beginning,
                             max_messages=args.max_messages, idle_s=args.idle, output_dir=args.output_dir,
                             output_format=args.output_format)
    report = consume(config_from_args(args), options, out=lambda line: print(line, flush=True))
    print(report.summary(), file=sys.stderr)
    return 0
