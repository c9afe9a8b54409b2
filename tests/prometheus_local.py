"""A real Prometheus for the tests (Debian's binary, unpacked by ``make setup`` into .local/prometheus), scraping
given targets every second and evaluating the project's alert rules, queried over its HTTP API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from conftest import ROOT, port_base
from skyfilter.local.processes import free_port

BINARY = ROOT / ".local" / "prometheus" / "bin" / "prometheus"
RULES = ROOT / "conf" / "prometheus" / "rules.yml"


class LocalPrometheus:
    """One Prometheus server in ``folder``: jobs name -> targets, the shipped rules, 1 s scrapes and evaluations."""

    def __init__(self, folder: Path, jobs: dict[str, list[str]]):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port(port_base(19090))
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                                     for job, targets in jobs.items()]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [str(BINARY), f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._ready():
            assert self.process.poll() is None and time.monotonic() < deadline, self.log_text()
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict]:
        """The instant vector (or scalar, as one sample) ``promql`` gives now; a bad query raises."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            answer = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{promql}: {exc.read().decode()}") from None
        assert answer["status"] == "success", answer
        data = answer["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def value(self, promql: str) -> float | None:
        """The one value of ``promql`` summed over its series (None: no series)."""
        result = self.query(promql)
        return sum(float(sample["value"][1]) for sample in result) if result else None

    def wait_for(self, promql: str, check, timeout_s: float = 60.0) -> float | None:
        """Poll ``promql`` until ``check(value)`` holds; returns the value (the last one on a timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.value(promql)
            if (value is not None and check(value)) or time.monotonic() > deadline:
                return value
            time.sleep(1)

    def log_text(self) -> str:
        return (self.folder / "prometheus.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
