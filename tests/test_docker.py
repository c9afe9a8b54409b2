"""The Docker deployment and the Kubernetes manifests, checked as far as this machine can (no Docker engine).

They must parse, name files and executables that exist, and agree with
conf/docker.yaml, conf/versions.env, the Makefile and the metrics the stream
job really exports.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from skyfilter.core.config import Config
from skyfilter.core.versions import versions
from skyfilter.kafka.topics import replication
from skyfilter.lanes.monitoring import StreamMonitor

DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
CFG = Config.load(ROOT / "conf" / "docker.yaml")
KAFKA_NODES = sorted(name for name in SERVICES if name.startswith("kafka-"))
WORKERS = sorted(name for name in SERVICES if name.startswith("spark-worker-"))
OWN_IMAGE = [name for name, service in SERVICES.items() if service.get("image") == "skyfilter:latest"]


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_every_part_of_the_deployment_is_there():
    assert len(KAFKA_NODES) == 3 and len(WORKERS) == int(CFG.get("spark_cluster.workers"))
    assert {"spark-master", "stream", "producer", "jupyter", "prometheus", "grafana", "registry"} <= set(SERVICES)
    registry = SERVICES["registry"]["command"]
    assert registry[:3] == ["skyfilter", "registry", "serve"] and _flag(registry, "--host") == "0.0.0.0"
    assert registry and SERVICES["registry"]["ports"] == [f"127.0.0.1:{_flag(registry, '--port')}:8081"]


def test_kafka_nodes_agree_with_the_config_and_the_pinned_version():
    factor, insync = replication(CFG, len(KAFKA_NODES))
    advertised, ids = set(), set()
    for name in KAFKA_NODES:
        node = SERVICES[name]
        env = node["environment"]
        assert node["image"] == f"apache/kafka:{versions()['KAFKA_VERSION']}"
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == factor == 3
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) == insync == 2
        assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) == int(CFG.get("kafka.max_message_bytes"))
        assert int(env["KAFKA_NUM_PARTITIONS"]) == int(CFG.get("topics.alerts_partitions"))
        ids.add(env["KAFKA_NODE_ID"])
        advertised.add(env["KAFKA_ADVERTISED_LISTENERS"].removeprefix("PLAINTEXT://"))
        voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
        assert sorted(v.split("@")[1].split(":")[0] for v in voters) == KAFKA_NODES
    assert ids == {"1", "2", "3"}
    assert advertised == set(CFG.bootstrap_servers.split(","))


def test_spark_cluster_agrees_with_the_config():
    master = SERVICES["spark-master"]["command"]
    url = f"spark://{CFG.get('spark_cluster.host')}:{CFG.get('spark_cluster.master_port')}"
    assert _flag(master, "--host") == CFG.get("spark_cluster.host") == "spark-master"
    assert int(_flag(master, "--port")) == int(CFG.get("spark_cluster.master_port"))
    assert int(_flag(master, "--webui-port")) == int(CFG.get("spark_cluster.master_webui_port"))
    for name in WORKERS:
        worker = SERVICES[name]["command"]
        assert worker[-1] == url
        assert int(_flag(worker, "--cores")) == int(CFG.get("spark_cluster.worker_cores"))
        assert _flag(worker, "--memory") == CFG.get("spark_cluster.worker_memory")
        assert "state:/data/state" in SERVICES[name]["volumes"], "executors write the same Delta tables"
    stream = SERVICES["stream"]["command"]
    assert _flag(stream, "--master") == url
    assert "state:/data/state" in SERVICES["stream"]["volumes"] and CFG.get("state_dir") == "/data/state"


def test_prometheus_scrapes_the_port_the_stream_serves():
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"stream:{CFG.get('monitoring.port')}", f"stream:{CFG.get('monitoring.archive_port')}"]
    assert CFG.get("monitoring.host") == "0.0.0.0", "reachable from the Prometheus container"


@pytest.mark.parametrize("service", OWN_IMAGE)
def test_commands_name_executables_and_files_that_exist(service):
    command = SERVICES[service]["command"]
    setup = (ROOT / "setup.py").read_text()
    executables = {"skyfilter": "skyfilter=skyfilter.cli:main" in setup,
                   "jupyter": "jupyterlab==" in setup,
                   "spark-submit": (Path(sys.executable).parent / "spark-submit").exists(),
                   "spark-class": (Path(sys.executable).parent / "spark-class").exists()}
    assert executables.get(command[0]), f"{service}: '{command[0]}' is not installed by the project"
    for argument in command[1:]:
        if re.fullmatch(r"[\w./-]+\.(py|yaml|ipynb)", argument):
            assert (ROOT / argument).exists(), f"{service}: {argument} does not exist"
    if "--config" in command:
        assert _flag(command, "--config") == "conf/docker.yaml"
    assert SERVICES[service]["environment"]["SKYFILTER_CONFIG"] == "/opt/skyfilter/conf/docker.yaml"


def test_mounted_files_exist():
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: {source} does not exist"


def test_the_image_installs_with_the_same_make_steps():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    runs = [line for line in dockerfile.splitlines() if line.startswith("RUN")]
    assert f"FROM python:{versions()['PYTHON_VERSION']}-" in dockerfile
    assert "openjdk-17-jre-headless" in dockerfile
    assert re.search(r"^RUN make setup-image\b", dockerfile, re.M)
    assert not any("pip" in line for line in runs), "Python packages come from `make`, like on a laptop"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^setup-image: setup ", makefile, re.M), "setup-image builds on the developer's `make setup`"
    assert "ENV PATH=/opt/skyfilter/.venv/bin" in dockerfile
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".local", ".git"} <= set(ignored)


def _exported_metrics() -> set[str]:
    cfg = Config.load(ROOT / "conf" / "local.yaml", {"monitoring.port": None})
    monitor = StreamMonitor(cfg, "s", "t")
    names = set()
    for family in monitor.registry.collect():
        names |= {family.name, f"{family.name}_total" if family.type == "counter" else family.name,
                  f"{family.name}_info" if family.type == "info" else family.name}
        if family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "count", "sum")}
    monitor.close()
    return names


def test_the_dashboard_shows_only_metrics_the_stream_exports():
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "skyfilter.json").read_text())
    datasource = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    exported = _exported_metrics()
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid
            used |= set(re.findall(r"skyfilter_[a-z_]+", target["expr"]))
    assert used and used <= exported, used - exported
    wanted = {"skyfilter_input_alerts_total", "skyfilter_heartbeat_timestamp_seconds",
              "skyfilter_batch_duration_seconds", "skyfilter_delivery_latency_seconds_bucket",
              "skyfilter_kafka_consumer_lag", "skyfilter_kafka_consumer_lag_seconds",
              "skyfilter_filter_matches_total", "skyfilter_broker_messages_total", "skyfilter_filter_quarantined",
              "skyfilter_quarantined_filters", "skyfilter_dead_letters_total"}
    assert wanted <= used, f"the dashboard misses {wanted - used}"


def test_kubernetes_manifests_match_the_compose_file():
    kafka = {d["kind"]: d for d in yaml.safe_load_all((DOCKER / "k8s" / "kafka.yaml").read_text())}
    assert kafka["Kafka"]["spec"]["kafka"]["version"] == versions()["KAFKA_VERSION"]
    assert kafka["KafkaNodePool"]["spec"]["replicas"] == len(KAFKA_NODES)
    assert all(listener["type"] == "internal" for listener in kafka["Kafka"]["spec"]["kafka"]["listeners"])
    env = SERVICES[KAFKA_NODES[0]]["environment"]
    for key, value in kafka["Kafka"]["spec"]["kafka"]["config"].items():
        assert str(value).lower() == str(env["KAFKA_" + key.upper().replace(".", "_")]).lower(), key
    manifests = list(yaml.safe_load_all((DOCKER / "k8s" / "skyfilter.yaml").read_text()))
    deployments = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Deployment"}
    containers = {name: d["spec"]["template"]["spec"]["containers"][0] for name, d in deployments.items()}
    assert containers["spark-master"]["command"] == SERVICES["spark-master"]["command"]
    assert containers["spark-worker"]["command"] == SERVICES[WORKERS[0]]["command"]
    assert deployments["spark-worker"]["spec"]["replicas"] == len(WORKERS)
    stream = containers["stream"]["command"]
    assert stream == SERVICES["stream"]["command"] + ["--bootstrap", "skyfilter-kafka-bootstrap:9092"]
    assert containers["registry"]["command"] == SERVICES["registry"]["command"] + [
        "--set", "kafka.bootstrap_servers=skyfilter-kafka-bootstrap:9092"]
    assert {c["image"] for c in containers.values()} == {"skyfilter:latest"}
    annotations = deployments["stream"]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == int(CFG.get("monitoring.port"))
