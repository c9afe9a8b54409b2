"""How fresh the stream's Prometheus figures are while alerts flow, scraped as a Prometheus would.

Every ``every_s`` seconds the scraper reads the job's ``/metrics`` and, at the
same moment, Kafka's end offsets of the input topic.  Afterwards each scrape is
set against the truth the benchmark reads back:

* delivered: the latency histograms' count against the broker messages whose
  delivery time came before the scrape; the figure is as old as the first
  delivery it does not count yet (0 when it counts them all);
* read: alerts the Real-time tasks are counted to have read against alerts
  appended to the input topic, in seconds at the sending rate;
* lag: the largest lag in seconds the endpoint showed.
"""

from __future__ import annotations

import bisect
import threading
import time
import urllib.request


def scrape(url: str) -> dict[str, float]:
    """The sums a freshness check reads from one scrape of ``url``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    sums = {"read": 0.0, "delivered": 0.0, "lag_s": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "skyfilter_input_alerts_total" and sample.labels.get("lane") == "realtime":
                sums["read"] += sample.value
            elif sample.name == "skyfilter_delivery_latency_seconds_count":
                sums["delivered"] += sample.value
            elif sample.name == "skyfilter_kafka_consumer_lag_seconds" and \
                    sample.labels.get("lane") in ("realtime", "delivery"):
                sums["lag_s"] = max(sums["lag_s"], sample.value)
    return sums


class MetricsScraper:
    """Scrapes ``url`` and the input topic's end offsets every ``every_s`` seconds, in a thread."""

    def __init__(self, cfg, url: str, topic: str, every_s: float):
        from skyfilter.kafka.lag import LatestOffsets

        self.url = url
        self.topic = topic
        self.every_s = every_s
        self.latest = LatestOffsets(cfg)
        self.started = sum(self.latest(topic).values())  # alerts on the topic before the stream ran
        self.scrapes: list[dict] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="metrics-scraper")

    def start(self) -> MetricsScraper:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.every_s):
            appended = sum(self.latest(self.topic).values()) - self.started
            try:
                self.scrapes.append({"at": time.time(), "appended": appended, **scrape(self.url)})
            except OSError:
                continue  # the job restarting: its endpoint is away

    def stop(self) -> list[dict]:
        self.stopping.set()
        self.thread.join(self.every_s + 10)
        self.latest.close()
        return self.scrapes


def freshness(scrapes: list[dict], delivered_at: list[float], rate: float, since: float, until: float) -> dict:
    """How old the scraped figures were during sending (scrapes from ``since`` to ``until``, epoch s).

    ``delivered_at``: the delivery time (epoch s) of every broker message, sorted.
    """
    during = [s for s in scrapes if since <= s["at"] <= until]
    if not during:
        return {"scrapes": 0, "delivered_stale_max_s": None, "read_behind_max_s": None, "lag_shown_max_s": None}
    stale = []
    for s in during:
        counted, true = int(s["delivered"]), bisect.bisect_right(delivered_at, s["at"])
        stale.append(0.0 if counted >= true else s["at"] - delivered_at[counted])
    behind = [max(0.0, s["appended"] - s["read"]) / rate for s in during]
    return {"scrapes": len(during), "delivered_stale_max_s": round(max(stale), 2),
            "read_behind_max_s": round(max(behind), 2), "lag_shown_max_s": round(max(s["lag_s"] for s in during), 2)}
