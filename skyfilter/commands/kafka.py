"""``skyfilter kafka``: start, stop or inspect the local Kafka (KRaft) cluster."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments, config_from_args


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter kafka`` to the command's parser."""
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
    kafka.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``skyfilter kafka``; errors raise :class:`SkyfilterError`."""
    from skyfilter.kafka.clients import credentials_dir
    from skyfilter.kafka.security import grant
    from skyfilter.kafka.topics import replication
    from skyfilter.local.kafka import LocalKafka

    cfg = config_from_args(args)
    if getattr(args, "port", None):
        cfg = cfg.with_values({"kafka.base_port": args.port})
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
