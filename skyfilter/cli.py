"""The `skyfilter` command: local Kafka, producers, the demo, the benchmarks.

Every subcommand takes ``--config`` (default conf/local.yaml) and ``--set
key=value`` overrides; errors print as one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.local.arguments import add_config_arguments, config_from_args

DESCRIPTION = """skyfilter: the streaming filter stage of an astronomical alert stream.

Producers publish Avro alerts to Kafka; the Spark job pipelines/filter_stream.py
applies SQL and Python filters and fans matches out to per-broker topics,
archiving every night to Delta tables."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skyfilter", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    kafka = commands.add_parser("kafka", help="start, stop or inspect the local Kafka (KRaft) cluster",
                                description="Run Apache Kafka locally in KRaft mode from the Maven Central "
                                            "jars; data and logs live under <state_dir>/kafka.  `skyfilter kafka "
                                            "ACTION --help` explains each action.")
    actions = kafka.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser(
        "start", help="start the local nodes and wait until the cluster answers",
        description="Start N local KRaft nodes (combined broker and controller) bound to 127.0.0.1, from the "
                    "Maven Central jars, and wait until the cluster answers; print its bootstrap servers.  Node i "
                    "listens on PORT+2i (its controller on PORT+2i+1).  --nodes 3 (or --config conf/cluster.yaml) "
                    "runs three nodes with replication 3 and min.insync.replicas 2; --config conf/secure.yaml adds "
                    "SASL/SCRAM logins and one principal with ACLs per broker of --brokers.  Every other command "
                    "given the same --state-dir finds this cluster by itself.")
    start.add_argument("--nodes", type=int, help="number of KRaft nodes (default: kafka.nodes)")
    start.add_argument("--port", type=int, help="client port of node 1 (default: kafka.base_port)")
    start.add_argument("--brokers", help="brokers file whose principals a secure cluster gets (default: "
                                         "stream.brokers)")
    add_config_arguments(start, "where Kafka data and logs live")
    stop = actions.add_parser("stop", help="stop the nodes this state dir's `start` started",
                              description="Stop the local nodes of the state dir, by pid, each checked against "
                                          "its node's command line (nothing else is ever signalled).")
    add_config_arguments(stop, "where Kafka data and logs live")
    status = actions.add_parser("status", help="each node: running or stopped, ports, log file",
                                description="Each local node of the state dir: running (pid) or stopped, its "
                                            "client and controller ports (from its own server.properties) and log "
                                            "file; then the bootstrap servers of the running nodes.")
    add_config_arguments(status, "where Kafka data and logs live")
    grant = actions.add_parser("grant", help="(re)create the logins and ACLs of a secure cluster",
                               description="On a secure cluster (--config conf/secure.yaml): (re)create the "
                                           "pipeline's, the producer's and every broker's login and ACLs from the "
                                           "brokers file.  `start` does it too.")
    grant.add_argument("--brokers", help="brokers file (default: stream.brokers)")
    add_config_arguments(grant, "where Kafka data and logs live")

    spark = commands.add_parser(
        "spark", help="start or stop a Spark standalone cluster on this machine",
        description="Run a Spark standalone master and workers from the installed pyspark (loopback only; "
                    "logs under <state_dir>/spark).  Then submit the unchanged job to it:\n"
                    "  spark-submit --master spark://127.0.0.1:7077 pipelines/filter_stream.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    spark.add_argument("action", choices=["start-cluster", "stop-cluster", "status"])
    spark.add_argument("--workers", type=int, help="start-cluster: number of workers (default: spark_cluster.workers)")
    add_config_arguments(spark, "where daemon logs and work folders live")

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

    from skyfilter.tools.watch_tools import add_commands as add_watch_commands

    add_watch_commands(commands)

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

    bench = commands.add_parser(
        "bench", help="run one benchmark experiment (results into bench/results)",
        description="Run a benchmark from bench/: " + "; ".join(f"{name}: {what}" for name, (_, what)
                                                                 in BENCHMARKS.items())
                    + ". Options after the experiment's name go to it (see `skyfilter bench NAME --help`).")
    bench.add_argument("experiment", choices=list(BENCHMARKS), metavar="EXPERIMENT",
                       help=", ".join(BENCHMARKS))
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the experiment's own options")
    return parser


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


def load_config(args: argparse.Namespace) -> Config:
    """The config file named by --config, with --set overrides and --state-dir applied."""
    return config_from_args(args)


def cmd_kafka(args: argparse.Namespace) -> int:
    from skyfilter.kafka.clients import credentials_dir
    from skyfilter.kafka.security import grant
    from skyfilter.kafka.topics import replication
    from skyfilter.local.kafka import LocalKafka

    cfg = load_config(args)
    if getattr(args, "port", None):
        cfg.set("kafka.base_port", args.port)
    cluster = LocalKafka(cfg, getattr(args, "nodes", None))
    if args.action in ("start", "grant"):
        bootstrap = cluster.start() if args.action == "start" else cluster.bootstrap_servers
        factor, insync = replication(cfg, len(cluster.nodes))
        print(f"Kafka running ({len(cluster.nodes)} KRaft node(s), replication {factor}, min.insync.replicas "
              f"{insync}, logs in {cluster.home}): bootstrap servers {bootstrap}")
        if cluster.secure:
            done = grant(cluster.admin_config(), args.brokers)
            print(f"{done['principals']} principals and {done['acls']} ACLs in place; credentials in "
                  f"{credentials_dir(cfg)} (never printed)")
    elif args.action == "stop":
        stopped = cluster.stop()
        print(f"stopped {len(stopped)} Kafka node(s)" + (f" (pids {', '.join(map(str, stopped))})" if stopped else ""))
    else:
        rows = cluster.status()
        if not rows:
            print(f"no local Kafka under {cluster.home}")
        for row in rows:
            state = f"running (pid {row['pid']})" if row["pid"] else "stopped"
            print(f"node {row['node']}: {state}, client port {row['port']}, controller port "
                  f"{row['controller_port']}, log {row['log']}")
        running = [f"127.0.0.1:{row['port']}" for row in rows if row["pid"]]
        if running:
            print(f"bootstrap servers {','.join(running)}")
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from skyfilter.producers.command import ProduceOptions, produce

    cfg = load_config(args)
    options = ProduceOptions(
        topic=args.topic, bootstrap=args.bootstrap, from_paths=args.from_paths, visits=args.visits,
        alerts_per_visit=args.alerts_per_visit, interval_s=args.interval_s, processes=args.producers,
        stamps=args.stamps, seed=args.seed, night=args.night, first_visit=args.first_visit,
        schema_version=args.schema_version, progress=not args.no_progress, ahead=args.ahead)
    report = produce(cfg, options)
    print(report.summary())
    return 1 if report.failures else 0


def cmd_filters(args: argparse.Namespace) -> int:
    from skyfilter.tools.filter_commands import run

    return run(load_config(args), args)


def cmd_spark(args: argparse.Namespace) -> int:
    from skyfilter.local.spark_cluster import SparkStandalone

    cfg = load_config(args)
    cluster = SparkStandalone(cfg, args.workers)
    if args.action == "start-cluster":
        url = cluster.start()
        print(cluster.summary())
        print(f"submit the stream job with: spark-submit --master {url} pipelines/filter_stream.py [options]")
    elif args.action == "stop-cluster":
        stopped = cluster.stop()
        pids = f" (pids {', '.join(map(str, stopped))})" if stopped else ""
        print(f"stopped {len(stopped)} Spark daemon(s){pids}")
    else:
        print(cluster.summary())
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    from skyfilter.tools.consume import ConsumeOptions, consume

    options = ConsumeOptions(topic=args.topic, group=args.group, from_beginning=args.from_beginning,
                             max_messages=args.max_messages, idle_s=args.idle, output_dir=args.output_dir,
                             output_format=args.output_format)
    report = consume(load_config(args), options, out=lambda line: print(line, flush=True))
    print(report.summary(), file=sys.stderr)
    return 0


def cmd_registry(args: argparse.Namespace) -> int:
    from skyfilter.registry.server import serve
    from skyfilter.registry.topic_store import KafkaTopicRegistry
    from skyfilter.tools.registry_tools import check_schema_file, delete_versions

    cfg = load_config(args)
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
        serve(cfg, args.host, args.port, log=lambda line: print(line, flush=True))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from skyfilter.local.status import status_screen

    cfg = load_config(args)
    if args.wait is not None:
        from skyfilter.local.status import wait_until_running

        wait_until_running(cfg, args.name or cfg.topics.alerts, args.wait)
    for line in status_screen(cfg, args.name):
        print(line)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from skyfilter.demo import run_demo

    return run_demo(load_config(args), args)


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    from skyfilter.core.versions import PROJECT_ROOT

    if not (PROJECT_ROOT / "bench").is_dir():
        raise SkyfilterError(f"the benchmarks live in a checkout's bench/ folder, and {PROJECT_ROOT} has none")
    sys.path.insert(0, str(PROJECT_ROOT))  # bench/ is the checkout's, not part of the installed package
    module = BENCHMARKS[args.experiment][0]
    return importlib.import_module(module).main(args.options)


def cmd_watch(args: argparse.Namespace) -> int:
    from skyfilter.tools.watch_tools import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `skyfilter` console script."""
    args = build_parser().parse_args(argv)
    handler = {"kafka": cmd_kafka, "produce": cmd_produce, "filters": cmd_filters, "demo": cmd_demo,
               "bench": cmd_bench, "spark": cmd_spark, "status": cmd_status,
               "registry": cmd_registry, "consume": cmd_consume, "watchlist": cmd_watch,
               "watchmap": cmd_watch}[args.command]
    try:
        return handler(args)
    except SkyfilterError as exc:
        print(f"skyfilter {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"skyfilter {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
