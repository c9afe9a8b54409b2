"""``skyfilter produce``: simulate visits of Rubin alerts, or replay Avro files, into Kafka."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter produce`` to the command's parser."""
    produce = commands.add_parser(
        "produce", help="simulate visits of Rubin alerts, or replay Avro files, into Kafka",
        description="Simulate a night of Rubin alerts (real FITS cutouts, histories) on a visit cadence, "
                    "or replay real Avro container files byte for byte (--from).  Messages use the "
                    "Confluent wire format with a schema id from the registry.")
    produce.add_argument("--from", dest="from_paths", nargs="+", metavar="PATH",
                         help="Avro container files or folders to replay instead of simulating")
    produce.add_argument("--visits", type=int, help="visits to simulate (default: simulation.visits)")
    produce.add_argument("--alerts-per-visit", type=int, help="alerts per visit (default: simulation.alerts_per_visit)")
    produce.add_argument("--interval", type=float, dest="interval_s",
                         help="seconds between visit starts (default: simulation.interval_s; 0 for --from)")
    produce.add_argument("--producers", type=int, default=1, help="parallel producer processes (default 1)")
    produce.add_argument("--stamps", action=argparse.BooleanOptionalAction, default=None,
                         help="include the three FITS cutouts (default: simulation.stamps)")
    produce.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    produce.add_argument("--ahead", action="store_true",
                         help="serialize every simulated visit before sending the first, so that during the visits "
                              "the producer only sends (holds the whole run in memory)")
    produce.add_argument("--night", help="night to simulate, YYYY-MM-DD (default: tonight)")
    produce.add_argument("--first-visit", type=int, default=1,
                         help="number of the night's first visit to simulate, to continue a night (default 1)")
    produce.add_argument("--schema-version",
                         help="Rubin schema version, e.g. 10.0 (default: simulation.schema_version)")
    produce.add_argument("--topic", help="Kafka topic (default: topics.alerts)")
    produce.add_argument("--bootstrap", help="Kafka bootstrap servers (default: kafka.bootstrap_servers)")
    produce.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_arguments(produce, "where the local Kafka runs (its bootstrap servers are found there)")
    produce.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter produce``; errors raise :class:`SkyfilterError`."""
    from skyfilter.producers.command import ProduceOptions, produce

    cfg = config_from_args(args)
    options = ProduceOptions(
        topic=args.topic, bootstrap=args.bootstrap, from_paths=args.from_paths, visits=args.visits,
        alerts_per_visit=args.alerts_per_visit, interval_s=args.interval_s, processes=args.producers,
        stamps=args.stamps, seed=args.seed, night=args.night, first_visit=args.first_visit,
        schema_version=args.schema_version, progress=not args.no_progress, ahead=args.ahead)
    report = produce(cfg, options)
    print(report.summary())
    return 1 if report.failures else 0
