"""A local Apache Kafka cluster in KRaft mode, run from the Maven Central jars.

Each node is one JVM (combined broker + controller) bound to 127.0.0.1, with its
data, logs, generated ``server.properties`` and pid file under
``<state_dir>/kafka/node-<id>/``.  ``stop`` only signals processes whose pid
file it wrote and whose command line still names that node's properties file.
"""

from __future__ import annotations

import base64
import json
import shutil
import string
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.versions import PROJECT_ROOT
from skyfilter.kafka.clients import client_settings, connect_as, uses_sasl
from skyfilter.kafka.security import ADMIN, ensure_credentials, format_arguments, server_settings
from skyfilter.kafka.topics import replication
from skyfilter.local.processes import first_error, launch, port_holder, port_in_use, running_pid, terminate

SERVER_TEMPLATE = PROJECT_ROOT / "conf" / "kafka" / "server.properties"
LOG4J_CONFIG = PROJECT_ROOT / "conf" / "kafka" / "log4j2.properties"


@dataclass(frozen=True)
class KafkaNode:
    """One KRaft node: its id, ports and folder."""

    node_id: int
    broker_port: int
    controller_port: int
    folder: Path

    @property
    def properties(self) -> Path:
        return self.folder / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.folder / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "logs" / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.folder / "logs" / "stdout.log"

    def pid(self) -> int | None:
        """The pid of this node's running JVM, or None (stale pid files are ignored)."""
        return running_pid(self.pid_file, str(self.properties))

    @classmethod
    def on_disk(cls, folder: Path) -> KafkaNode | None:
        """The node a folder holds, with the ports its ``server.properties`` listens on (None: no such file)."""
        path = folder / "server.properties"
        if not path.exists():
            return None
        settings = dict(line.split("=", 1) for line in path.read_text().splitlines()
                        if "=" in line and not line.lstrip().startswith("#"))
        controller = settings.get("controller.listener.names", "CONTROLLER")
        ports = {name: int(address.rsplit(":", 1)[1]) for name, _, address in
                 (entry.partition("://") for entry in settings.get("listeners", "").split(",") if "://" in entry)}
        client = next((port for name, port in ports.items() if name != controller), 0)
        return cls(int(settings.get("node.id", folder.name.split("-")[-1])), client, ports.get(controller, 0), folder)


class LocalKafka:
    """The local Kafka cluster described by a config (``kafka.*`` keys)."""

    def __init__(self, cfg: Config, nodes: int | None = None):
        self.cfg = cfg
        self.home = cfg.state_dir / "kafka"
        count = int(nodes or cfg.kafka.nodes)
        if count < 1:
            raise SkyfilterError(f"--nodes must be at least 1, got {count}")
        base = cfg.kafka.base_port
        self.nodes = [
            KafkaNode(i + 1, base + 2 * i, base + 2 * i + 1, self.home / f"node-{i + 1}")
            for i in range(count)
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in self.nodes)

    @property
    def secure(self) -> bool:
        """True when the config asks for SASL logins and ACLs (``kafka.security.protocol``)."""
        return uses_sasl(self.cfg)

    def admin_config(self) -> Config:
        """The config with this cluster's bootstrap servers, connecting as the admin principal."""
        cfg = connect_as(self.cfg, ADMIN)
        cfg = cfg.with_values({"kafka.bootstrap_servers": self.bootstrap_servers})
        return cfg

    # ----------------------------------------------------------------- start
    def start(self) -> str:
        """Start every node that is not running, wait until the cluster answers.

        Returns the bootstrap servers.  Raises SkyfilterError with the log path
        when Java or the jars are missing, a port is taken, or a node dies or
        does not answer in time.
        """
        java = shutil.which("java")
        if not java:
            raise SkyfilterError("java not found on PATH: local Kafka needs a Java 17 runtime "
                                 "(apt-get install openjdk-17-jre-headless)")
        libs = self.cfg.path("kafka.libs_dir")
        if not any(libs.glob("kafka_*.jar")):
            raise SkyfilterError(f"Kafka jars not found in {libs}: run `make setup` first")
        self._check_layout()
        if self.secure:
            ensure_credentials(self.cfg, [ADMIN])
        started = []
        for node in self.nodes:
            if node.pid():
                continue
            for port in (node.broker_port, node.controller_port):
                if port_in_use(port):
                    holder = port_holder(port)
                    raise SkyfilterError(
                        f"port {port} on 127.0.0.1 is already in use{f' by {holder}' if holder else ''} (another "
                        f"Kafka?): stop it, or choose other ports (--set kafka.base_port=N)")
            self._prepare(node, java, libs)
            started.append(self._launch(node, java, libs))
        self._wait_ready(started)
        return self.bootstrap_servers

    def _check_layout(self) -> None:
        layout_file = self.home / "cluster.json"
        layout = {"nodes": len(self.nodes), "base_port": self.nodes[0].broker_port, "secure": self.secure}
        if layout_file.exists():
            saved = json.loads(layout_file.read_text())
            if (saved["nodes"], saved["base_port"], saved.get("secure", False)) != tuple(layout.values()):
                kind = "secure " if saved.get("secure") else ""
                raise SkyfilterError(
                    f"{self.home} holds a {kind}{saved['nodes']}-node cluster on port {saved['base_port']}; "
                    f"stop it and remove that folder to start a different one")
            self.cluster_id = saved["cluster_id"]
        else:
            self.home.mkdir(parents=True, exist_ok=True)
            self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            layout_file.write_text(json.dumps({**layout, "cluster_id": self.cluster_id}))

    def _prepare(self, node: KafkaNode, java: str, libs: Path) -> None:
        """Write the node's server.properties and format its storage once."""
        factor, insync = replication(self.cfg, len(self.nodes))
        values = {
            "node_id": node.node_id,
            "quorum_voters": ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes),
            "broker_port": node.broker_port,
            "controller_port": node.controller_port,
            "data_dir": node.folder / "data",
            "default_partitions": 1,
            "replication_factor": factor,
            "min_insync_replicas": insync,
            "max_message_bytes": self.cfg.kafka.max_message_bytes,
            "listener_protocol": "SASL_PLAINTEXT" if self.secure else "PLAINTEXT",
            "security_settings": server_settings(self.cfg) if self.secure else "",
        }
        (node.folder / "logs").mkdir(parents=True, exist_ok=True)
        text = string.Template(SERVER_TEMPLATE.read_text()).substitute(values)
        node.properties.touch(mode=0o600)
        node.properties.write_text(text)
        if not (node.folder / "data" / "meta.properties").exists():
            result = subprocess.run(
                [java, *self._jvm_flags(node, libs), "kafka.tools.StorageTool", "format",
                 f"--cluster-id={self.cluster_id}", "--config", str(node.properties),
                 *(format_arguments(self.cfg) if self.secure else [])],
                capture_output=True, text=True)
            if result.returncode != 0:
                last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
                raise SkyfilterError(f"formatting Kafka storage of node {node.node_id} failed: {last[0]}")

    def _jvm_flags(self, node: KafkaNode, libs: Path) -> list[str]:
        heap = self.cfg.kafka.heap
        return [f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                f"-Dkafka.logs.dir={node.folder / 'logs'}",
                "-cp", f"{libs}/*"]

    def _launch(self, node: KafkaNode, java: str, libs: Path) -> tuple[KafkaNode, subprocess.Popen]:
        command = [java, *self._jvm_flags(node, libs), "kafka.Kafka", str(node.properties)]
        return node, launch(command, node.pid_file, node.stdout_file, cwd=node.folder)

    def _wait_ready(self, started: list[tuple[KafkaNode, subprocess.Popen]]) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.cfg.kafka.start_timeout_s
        admin = AdminClient(client_settings(self.admin_config(), log_level=0))
        while True:
            for node, proc in started:
                if proc.poll() is not None:
                    node.pid_file.unlink(missing_ok=True)
                    raise SkyfilterError(f"Kafka node {node.node_id} exited during start-up "
                                         f"(code {proc.returncode}): {_exit_cause(node)}; "
                                         f"see {node.log_file} and {node.stdout_file}")
            try:
                brokers = admin.list_topics(timeout=2).brokers
                if len(brokers) == len(self.nodes):
                    return
            except Exception:  # noqa: BLE001 - not up yet, try again until the deadline
                pass
            if time.monotonic() > deadline:
                log = started[0][0].log_file if started else self.nodes[0].log_file
                raise SkyfilterError(f"Kafka did not answer at {self.bootstrap_servers} within "
                                     f"{self.cfg.get('kafka.start_timeout_s')} s; see {log}")
            time.sleep(0.5)

    # ------------------------------------------------------------ stop/status
    def stop(self, timeout: float = 30.0) -> list[int]:
        """Stop the nodes this project started (SIGTERM, then SIGKILL). Returns the pids stopped."""
        running = {node: node.pid() for node in self.nodes_on_disk()}
        # all at once: a node waiting for a quorum that is leaving would hang
        terminate([pid for pid in running.values() if pid], timeout)
        for node in running:
            node.pid_file.unlink(missing_ok=True)
        return [pid for pid in running.values() if pid]

    def failure(self) -> str | None:
        """Why a node of this cluster is not running (the first error it logged); None while every node runs."""
        for node in self.nodes:
            if node.pid() is None:
                return f"Kafka node {node.node_id} is not running: {_exit_cause(node)} (see {node.log_file})"
        return None

    def nodes_on_disk(self) -> list[KafkaNode]:
        """Every node folder under the state dir, with the ports it was started with (the configured nodes
        for folders not written yet)."""
        known = {n.folder: n for n in self.nodes}
        for folder in sorted(self.home.glob("node-*"), key=lambda f: int(f.name.split("-")[-1])):
            known[folder] = KafkaNode.on_disk(folder) or known.get(folder)
        return sorted((n for n in known.values() if n is not None), key=lambda n: n.node_id)

    def status(self) -> list[dict]:
        """One entry per node on disk: id, client and controller ports, running pid (or None), log file."""
        return [{"node": n.node_id, "port": n.broker_port, "controller_port": n.controller_port, "pid": n.pid(),
                 "log": str(n.log_file)} for n in self.nodes_on_disk() if n.folder.exists()]


def _exit_cause(node: KafkaNode) -> str:
    """The first error a node logged before exiting."""
    return first_error([node.stdout_file, node.log_file])


def free_port_pair(start: int, nodes: int = 1) -> int:
    """A port p from ``start`` on such that p..p+2*nodes-1 (each node's client and controller ports) are free."""
    for port in range(start, start + 200, 2):
        if not any(port_in_use(p) for p in range(port, port + 2 * nodes)):
            return port
    raise SkyfilterError(f"no {2 * nodes} free ports in a row between {start} and {start + 200} on 127.0.0.1")
