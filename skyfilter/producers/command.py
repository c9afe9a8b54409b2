"""`skyfilter produce`: register the schema, create the topic, produce the visits."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from skyfilter.core.alert_columns import current_night
from skyfilter.core.config import Config
from skyfilter.kafka.clients import act_as, client_settings
from skyfilter.kafka.topics import check_reachable, ensure_topics
from skyfilter.producers.produce import AlertSource, ProduceReport, run_producers
from skyfilter.producers.sources import FileSource, SimulatedSource
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import rubin_schema

logger = logging.getLogger(__name__)


@dataclass
class ProduceOptions:
    """Everything `skyfilter produce` can be told (None = take it from the config)."""

    topic: str | None = None
    bootstrap: str | None = None
    from_paths: list[str] | None = None
    visits: int | None = None
    alerts_per_visit: int | None = None
    interval_s: float | None = None
    processes: int = 1
    stamps: bool | None = None
    seed: int = 0
    night: str | None = None
    first_visit: int = 1
    schema_version: str | None = None
    progress: bool = True
    ahead: bool = False  # serialize every simulated visit before the first is sent (SimulatedSource)


def produce(cfg: Config, options: ProduceOptions) -> ProduceReport:
    """Produce simulated or replayed alerts as the options say; returns the report."""
    topic = options.topic or cfg.topics.alerts
    cfg = act_as(cfg, "producer")
    if options.bootstrap:
        cfg = cfg.with_values({"kafka.bootstrap_servers": options.bootstrap})
    check_reachable(cfg)
    if options.from_paths:
        source = FileSource(options.from_paths)
        schema = source.schema
        interval = options.interval_s or 0.0
    else:
        schema = rubin_schema(options.schema_version or cfg.simulation.schema_version)
        interval = options.interval_s if options.interval_s is not None else cfg.simulation.interval_s
        source = SimulatedSource(
            schema, 0, options.night or current_night(cfg.stream.night_offset_hours),
            options.visits or cfg.simulation.visits,
            options.alerts_per_visit or cfg.simulation.alerts_per_visit,
            seed=options.seed,
            stamps=cfg.simulation.stamps if options.stamps is None else options.stamps,
            history_length=cfg.simulation.history_length, interval_s=interval,
            first_visit=options.first_visit, ahead=options.ahead)
    return send_source(cfg, topic, source, schema, interval, options.processes, options.progress)


def send_source(cfg: Config, topic: str, source: AlertSource, schema: dict, interval_s: float, processes: int = 1,
                progress: bool = True, producer_settings: dict | None = None,
                spread_s: float = 0.0) -> ProduceReport:
    """Create the topic, register the schema and produce every visit of ``source`` (as the producer principal).

    ``producer_settings`` override the config's librdkafka ``producer`` section (benchmarks compare them);
    ``spread_s``: each visit's alerts sent evenly over that many seconds (a steady rate) instead of at once.
    """
    cfg = act_as(cfg, "producer")
    ensure_topics(cfg, {topic: cfg.topics.alerts_partitions})
    source.schema_id = open_registry(cfg).register(subject_for(topic), schema, same_alerts=True)
    conf = client_settings(cfg, **(cfg.section("producer") | (producer_settings or {})))
    return run_producers(conf, topic, source, source.schema_id, interval_s, max(1, processes), progress,
                         spread_s)
