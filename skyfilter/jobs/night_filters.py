"""A night's archived alerts through the stream's filters, in one batch: what each broker's filters select.

Re-filtering a night (``replay_night.py``) and checking what the broker topics
received (``skyfilter/jobs/delivery_check.py``) both start here: the same filter
code as the stream, run over the archive instead of the Kafka topic, with the
watchlists and watchmaps of the night (or of today).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.core.alert_columns import detect
from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.filtering.decode import is_accepted
from skyfilter.filtering.filter_eval import add_filter_columns
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.plan.outgoing import add_broker_matches
from skyfilter.plan.stream_files import read_stream_files
from skyfilter.plan.stream_plan import resolve_filters
from skyfilter.spark.steps import apply_steps
from skyfilter.watch.columns import Watch, load_watch, template_columns, used_by, watch_as_of, watch_steps

logger = logging.getLogger(__name__)


@dataclass
class NightFilters:
    """A night's alerts as filters see them (``alerts``), and with each broker's matched filters (``matched``)."""

    alerts: DataFrame
    matched: DataFrame
    filters: list[FilterSpec]
    brokers: list[BrokerSpec]


def filter_night(cfg: Config, messages: DataFrame, inputs: InputSchemas, filters_dir: Path, brokers_file: Path,
                 which_watch: str = "night") -> NightFilters:
    """Apply the filters of ``filters_dir`` and the brokers of ``brokers_file`` to a night's archived messages
    (from :func:`skyfilter.archive.night_reader.read_messages`); before any cap."""
    frame = messages.withColumn("reject_reason", F.lit(None).cast("string"))
    watch = night_watch(cfg, messages, which_watch)
    filters, brokers, problems = resolve_filters(frame.withColumns(template_columns(watch)),
                                                 read_stream_files(filters_dir, brokers_file))
    for problem in problems:
        logger.warning(f"filter problem: {problem}")
    chosen = watch.chosen(used_by(filters))
    if chosen:
        logger.info(f"watchlists and watchmaps ({which_watch}'s versions): {Watch(chosen).describe()}")
    position = detect(inputs.reader, cfg)
    frame = apply_steps(frame, watch_steps(chosen, position.ra, position.dec, is_accepted()))
    return NightFilters(frame, add_broker_matches(add_filter_columns(frame, filters, is_accepted()), brokers),
                        filters, brokers)


def night_watch(cfg: Config, messages: DataFrame, which: str) -> Watch:
    """The watchlists and watchmaps a re-filter reads: ``today``'s, or the versions current when the night's
    last alert arrived (``night``: what the stream read then)."""
    if which == "today":
        return load_watch(cfg)
    last = messages.agg(F.max("kafka_timestamp").alias("last")).first()["last"]
    return watch_as_of(cfg, int(last.timestamp() * 1000)) if last is not None else Watch()
