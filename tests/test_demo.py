"""`skyfilter demo`, the command `make demo` runs, end to end on smaller visits, and its one-line refusals.

Each broker topic is compared with an independent evaluation of the produced alerts:
the input topic read back and decoded with fastavro, the filters of ``filters/``
written again here in plain Python, the caps of ``conf/brokers.yaml`` applied per
visit.  Not the project's own filter code.
"""

from __future__ import annotations

import fcntl
import math
import re
import socket
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import ROOT, decode_messages, port_base
from skyfilter.commands.demo_night import check_disk, disk_needed_mb
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.read_back import read_topic
from skyfilter.local.kafka import LocalKafka, free_port_pair
from skyfilter.schemas.avro import rubin_schema

SKYFILTER = str(Path(sys.executable).parent / "skyfilter")
POLE_RA, POLE_DEC = math.radians(192.85948), math.radians(27.12825)  # Galactic north pole, J2000


def _values(*fields):
    return None if any(value is None for value in fields) else fields


def bright_transient(alert: dict) -> bool:
    source = alert["diaSource"]
    return _values(source["snr"], source["reliability"], source["isNegative"]) is not None and \
        source["snr"] > 50 and source["reliability"] > 0.8 and not source["isNegative"]


def fast_riser(alert: dict) -> bool:
    source, history = alert["diaSource"], alert.get("prvDiaSources") or []
    earlier = [d["psfFlux"] for d in history if d["psfFlux"] is not None and d["psfFlux"] > 0
               and 0 < source["midpointMjdTai"] - d["midpointMjdTai"] < 5]
    return bool(earlier) and source["psfFlux"] is not None and source["psfFlux"] > 2.5 * max(earlier)


def galactic_plane_variable(alert: dict) -> bool:
    source = alert["diaSource"]
    ra, dec = math.radians(source["ra"]), math.radians(source["dec"])
    sin_b = math.sin(dec) * math.sin(POLE_DEC) + math.cos(dec) * math.cos(POLE_DEC) * math.cos(ra - POLE_RA)
    latitude = math.degrees(math.asin(max(-1.0, min(1.0, sin_b))))
    return source["reliability"] is not None and abs(latitude) < 10 and source["reliability"] > 0.5


def reliable_red(alert: dict) -> bool:
    source = alert["diaSource"]
    return _values(source["band"], source["reliability"], source["snr"]) is not None and \
        source["band"] in ("i", "z", "y") and source["reliability"] > 0.9 and source["snr"] > 10


def bright_summary(alert: dict) -> bool:
    source = alert["diaSource"]
    return _values(source["snr"], source["isNegative"]) is not None and source["snr"] > 100 \
        and not source["isNegative"]


FILTERS = {f.__name__: f for f in (bright_transient, fast_riser, galactic_plane_variable, reliable_red,
                                   bright_summary)}


@pytest.mark.slow  # the demo starts Kafka and Spark of its own
def test_the_demo_delivers_what_an_independent_evaluation_expects(tmp_path):
    demo_dir, port = tmp_path / "demo", free_port_pair(port_base(19400))
    result = subprocess.run([SKYFILTER, "demo", "--visits", "2", "--alerts-per-visit", "150", "--interval", "4",
                             "--state-dir", str(demo_dir), "--set", f"kafka.base_port={port}",
                             "--set", "monitoring.port=null", "--keep"],
                            capture_output=True, text=True, timeout=900, cwd=ROOT)
    cfg = Config.load(None, {"state_dir": str(demo_dir), "kafka.base_port": port,
                             "kafka.bootstrap_servers": f"127.0.0.1:{port}"})
    try:
        (tmp_path / "demo.out").write_text(result.stdout + result.stderr)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        assert "demo finished in" in result.stdout and "every broker holds what its filters and caps select" \
            in result.stdout
        assert re.search(r"latency, input append -> output append: p50 [\d.]+ s, p99 [\d.]+ s over [1-9]\d* "
                         r"delivered alerts", result.stdout)
        stream_console = (demo_dir / "filter_stream.log").read_text()
        assert "no new alerts for 12 s: stopping" in result.stdout  # idle_stop_s(4)
        assert not [line for line in stream_console.splitlines() if " ERROR " in line], stream_console[-3000:]

        inputs = read_topic(cfg, cfg.topics.alerts)
        alerts = decode_messages(inputs, rubin_schema(cfg.simulation.schema_version))
        assert len(alerts) == 300
        brokers = yaml.safe_load((ROOT / "conf" / "brokers.yaml").read_text())
        default_cap = brokers.get("max_alerts_per_visit", 20)
        for name, broker in brokers["brokers"].items():
            matched = {}
            for alert in alerts:
                names = [f for f in broker["filters"] if FILTERS[f](alert)]
                if names:
                    matched[str(alert["diaSourceId"])] = (alert["diaSource"]["visit"], ",".join(names))
            messages = read_topic(cfg, broker.get("topic", f"filtered.{name}"))
            held = Counter(m.headers["alert_id"] for m in messages)
            assert held, f"{name}: the demo delivers to every broker (its night must hold alerts each selects)"
            assert all(times == 1 for times in held.values()), f"{name}: an alert delivered twice"
            assert set(held) <= set(matched), f"{name}: alerts its filters do not select"
            assert all(m.headers["filters"] == matched[m.headers["alert_id"]][1] for m in messages)
            cap = broker.get("max_alerts_per_visit", default_cap)
            if cap is None:
                assert set(held) == set(matched), f"{name}: not every match delivered"
                continue
            per_visit, held_per_visit = Counter(v for v, _ in matched.values()), defaultdict(int)
            for alert_id in held:
                held_per_visit[matched[alert_id][0]] += 1
            assert {v: held_per_visit[v] for v in per_visit} == {v: min(cap, n) for v, n in per_visit.items()}, \
                f"{name}: each visit holds min(cap, matches)"
        assert any(read_topic(cfg, f"filtered.{name}") for name in brokers["brokers"]), "something was delivered"
    finally:
        LocalKafka(cfg).stop()


def test_a_demo_beside_another_demo_or_a_taken_port_is_one_line_and_leaves_nothing(tmp_path):
    demo_dir, port = tmp_path / "demo", free_port_pair(port_base(19500))
    with socket.socket() as holder:  # something else listens on the demo's Kafka port
        holder.bind(("127.0.0.1", port))
        holder.listen()
        before = {p.pid for p in psutil.process_iter()}
        taken = subprocess.run([SKYFILTER, "demo", "--state-dir", str(demo_dir), "--set", f"kafka.base_port={port}"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert taken.returncode != 0
    [line] = taken.stderr.strip().splitlines()
    assert f"port {port} on 127.0.0.1 is already in use by pid" in line and "kafka.base_port" in line
    started = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.pid not in before
               and str(demo_dir) in " ".join(p.info["cmdline"] or [])]
    assert not started, "nothing left running"

    with open(tmp_path / "demo.lock", "w") as lock:  # another demo of the same folder runs
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242")
        lock.flush()
        twice = subprocess.run([SKYFILTER, "demo", "--state-dir", str(demo_dir)], capture_output=True, text=True,
                               timeout=120, cwd=ROOT)
    assert twice.returncode != 0
    assert twice.stderr.strip().splitlines() == [
        f"skyfilter demo: error: another `skyfilter demo` is running on {demo_dir} (pid 4242): wait for it to "
        f"finish, or stop it"]


def test_a_disk_too_full_for_the_demo_is_one_line(tmp_path):
    with pytest.raises(SkyfilterError) as refused:
        check_disk(tmp_path, disk_needed_mb(10**9))
    assert str(refused.value).startswith(f"not enough free disk space under {tmp_path}: ")
    assert "MB free" in str(refused.value) and "\n" not in str(refused.value)
    check_disk(tmp_path, disk_needed_mb(10))
