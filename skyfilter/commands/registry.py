"""``skyfilter registry``: serve the embedded schema registry to standard clients, or list what it holds."""

from __future__ import annotations

import argparse
from pathlib import Path

from skyfilter.core.errors import SkyfilterError
from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter registry`` to the command's parser."""
    registry = commands.add_parser(
        "registry", help="serve the embedded schema registry to standard clients, or list what it holds",
        description="The embedded schema registry lives in a compacted Kafka topic (schema_registry.topic).  "
                    "`serve` answers Confluent's Schema Registry REST API over it, so confluent-kafka's "
                    "SchemaRegistryClient, AvroSerializer and AvroDeserializer (and every client built on "
                    "them) decode skyfilter's topics: point them at http://HOST:PORT.  `list` prints every "
                    "subject with its versions and schema ids.  `check SCHEMA_FILE --topic T` says whether the "
                    "stream would read alerts written with that schema (exit 1 if not).  `delete TOPIC_OR_SUBJECT "
                    "--version N` soft-deletes a version (then --permanent removes it), as Confluent's registry "
                    "does: the stream stops reading alerts of it; messages already written still decode by id.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    registry.add_argument("action", choices=["serve", "list", "check", "delete"])
    registry.add_argument("target", nargs="?", metavar="SCHEMA_FILE|TOPIC",
                          help="check: an Avro schema file (.avsc) or an Avro container file of alerts (.avro); "
                               "delete: a topic or its '<topic>-value' subject")
    registry.add_argument("--topic", help="check: the input topic (default: topics.alerts)")
    registry.add_argument("--version", type=int, help="delete: the version number (default: every version)")
    registry.add_argument("--permanent", action="store_true",
                          help="delete: remove versions soft-deleted before, for good")
    registry.add_argument("--host", help="serve: address to listen on (default: schema_registry.serve.host)")
    registry.add_argument("--port", type=int, help="serve: port (default: schema_registry.serve.port)")
    add_config_arguments(registry, "where the local Kafka runs (its bootstrap servers are found there)", bootstrap=True)
    registry.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter registry``; errors raise :class:`SkyfilterError`."""
    from skyfilter.registry.server import serve
    from skyfilter.registry.topic_store import KafkaTopicRegistry
    from skyfilter.tools.registry_tools import check_schema_file, delete_versions

    cfg = config_from_args(args)
    if args.action in ("check", "delete") and not args.target:
        raise SkyfilterError(f"registry {args.action} needs a " + ("schema file" if args.action == "check" else
                                                                    "topic or subject"))
    if args.action == "list":
        for line in KafkaTopicRegistry(cfg).listing():
            print(line)
    elif args.action == "check":
        problem, line = check_schema_file(cfg, Path(args.target), args.topic or cfg.topics.alerts)
        print(line)
        return 1 if problem else 0
    elif args.action == "delete":
        print(delete_versions(cfg, args.target, args.version, args.permanent))
    else:
        serve(cfg, args.host, args.port)
    return 0
