"""Rewind an archived night: re-stream it into Kafka, or re-filter it in batch.

    spark-submit pipelines/replay_night.py --night YYYY-MM-DD --to-topic T [--speed 1|10|max] [--visits A-B]
    spark-submit pipelines/replay_night.py --night YYYY-MM-DD --filters-dir DIR --brokers FILE [--to-brokers]

Re-streamed messages are the originals byte for byte (cutouts rejoined,
each message checked against the hash stored at archiving), sent in their
original order, to their original partition numbers, with the gaps between
visits scaled by ``--speed``; filter_stream.py runs on them unchanged.
Re-filtering applies the same filter code as the stream to the night in one
batch and writes the matches to a Delta table (and, with --to-brokers, to the
broker topics).  ``--as-of-version`` / ``--as-of-timestamp`` read the archive as
it was then (Delta time travel).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.archive.night_reader import NightSelection, last_night, parse_visits, read_messages
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.delivery.caps import VisitCaps
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.jobs.job_config import add_common_arguments, job_main
from skyfilter.jobs.night_filters import filter_night
from skyfilter.kafka.clients import act_as, client_settings, spark_sink_options
from skyfilter.kafka.topics import check_reachable, ensure_topics, topic_partitions
from skyfilter.local.arguments import config_from_args
from skyfilter.plan.outgoing import kafka_rows, match_rows
from skyfilter.plan.outputs import prepare_outputs, register_writers
from skyfilter.plan.stream_plan import configured_cutouts
from skyfilter.plan.tables import table_paths
from skyfilter.registry.client import open_registry
from skyfilter.spark.session import get_spark

logger = logging.getLogger("skyfilter.jobs.replay_night")  # the same name when run as __main__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="replay_night.py",
        description="Rewind an archived night: re-stream it into a Kafka topic at its original cadence "
                    "(scaled by --speed), byte for byte, or re-filter it in batch with the stream's filter code.")
    parser.add_argument("--night", required=True,
                        help="the night to replay, YYYY-MM-DD, or 'last' (the latest night in the archive)")
    parser.add_argument("--name", help="archive to read: the stream's name (default: topics.alerts)")
    parser.add_argument("--visits", help="only visits A-B of the night (positions from 1, inclusive)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--as-of-version", type=int, help="read the alerts table as of this Delta version")
    when.add_argument("--as-of-timestamp", help="read the alerts table as it was at this time (e.g. 2026-11-21 18:00)")
    parser.add_argument("--to-topic", help="re-stream the night into this Kafka topic")
    parser.add_argument("--speed", default="max",
                        help="with --to-topic: 1 = real time, 10 = ten times faster, max = no waiting (default)")
    parser.add_argument("--filters-dir", help="re-filter the night with these filters (needs --brokers)")
    parser.add_argument("--brokers", help="brokers file for re-filtering")
    parser.add_argument("--matches-table", help="Delta table for the re-filtered matches "
                                                "(default: <state_dir>/delta/<name>/rematches)")
    parser.add_argument("--watch", choices=["night", "today"], default="night",
                        help="re-filter with the watchlists and watchmaps as they were when the night was streamed "
                             "(night, the default) or as they are now (today)")
    parser.add_argument("--to-brokers", action="store_true", help="also write re-filtered matches to broker topics")
    parser.add_argument("--show-matches", action="store_true",
                        help="read the night's re-filtered matches back from the matches table: the count per "
                             "broker and filter, then the first --limit matches")
    parser.add_argument("--limit", type=int, default=20, help="with --show-matches: matches listed (default 20)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if not args.to_topic and not args.filters_dir and not args.show_matches:
        parser.error("give --to-topic T (re-stream), --filters-dir DIR --brokers FILE (re-filter) or "
                     "--show-matches")
    if args.filters_dir and not args.brokers:
        parser.error("--filters-dir needs --brokers")
    return args


def speed_factor(text: str) -> float | None:
    """None for 'max', else the positive factor by which visit gaps are divided."""
    if str(text).lower() == "max":
        return None
    try:
        factor = float(text)
    except ValueError:
        factor = 0.0
    if factor <= 0:
        raise SkyfilterError(f"--speed must be a positive number or 'max', got '{text}'")
    return factor


def restream(cfg: Config, messages: DataFrame, inputs: InputSchemas, topic: str, speed: float | None,
             progress: bool) -> dict:
    """Send the night's messages to ``topic`` in original order, partition and visit cadence."""
    from confluent_kafka import Producer
    from tqdm import tqdm

    if "byte_identical" in messages.columns:  # an archive of the earlier layout: messages are re-encoded
        messages = messages.persist()  # re-encoding a night is costly: do it once for the checks and the send
        mismatched = messages.where(~F.coalesce(F.col("byte_identical"), F.lit(False))).count()
        if mismatched:
            raise SkyfilterError(f"{mismatched} archived alert(s) would not be restored byte for byte "
                                 f"(hash mismatch or missing cutouts); nothing was sent")
    partitions = max(topic_partitions(cfg, messages.first().kafka_topic), 1)
    ensure_topics(cfg, {topic: partitions})
    register_writers(open_registry(cfg), topic, inputs.readable, same_alerts=True)
    target_partitions = topic_partitions(cfg, topic)
    starts = {r.visit_id: r.start.timestamp() for r in
              messages.groupBy("visit_id").agg(F.min("kafka_timestamp").alias("start")).collect()}
    ordered = messages.select("visit_id", "kafka_partition", "kafka_key", "kafka_value", "kafka_timestamp") \
        .orderBy("kafka_timestamp", "kafka_partition", "kafka_offset")
    total = messages.count()
    producer = Producer(client_settings(cfg, **cfg.section("producer")))
    failures: list[str] = []

    def delivered(error, _message):
        if error is not None:
            failures.append(error.str())

    first_start = min(starts.values()) if starts else 0.0
    began, cadence_origin = time.time(), None
    current_visit = None
    bar = tqdm(total=total, unit="alert", disable=not progress, desc=f"replaying to {topic}")
    for row in ordered.toLocalIterator(prefetchPartitions=True):
        if row.visit_id != current_visit:
            current_visit = row.visit_id
            cadence_origin = cadence_origin or time.time()  # the first visit goes out as soon as it is read
            if speed is not None:
                time.sleep(max(0.0, cadence_origin + (starts[row.visit_id] - first_start) / speed - time.time()))
        partition = row.kafka_partition if row.kafka_partition < target_partitions else -1
        while True:
            try:
                producer.produce(topic, value=bytes(row.kafka_value), key=row.kafka_key and bytes(row.kafka_key),
                                 partition=partition, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        bar.update(1)
    remaining = producer.flush(120)
    bar.close()
    messages.unpersist()
    if failures or remaining:
        raise SkyfilterError(f"{len(failures) + remaining} message(s) not delivered to '{topic}': "
                             f"{failures[0] if failures else 'flush timed out'}")
    return {"alerts": total, "visits": len(starts), "elapsed": time.time() - began}


def refilter(spark, cfg: Config, messages: DataFrame, inputs: InputSchemas, args: argparse.Namespace,
             name: str) -> dict:
    """Apply the filters to the night in batch; matches to Delta (and to the broker topics)."""
    night = filter_night(cfg, messages, inputs, Path(args.filters_dir), Path(args.brokers), args.watch)
    brokers = night.brokers
    decided = VisitCaps().decide(night.matched, brokers).persist()  # whole visits: lowest alert ids kept
    if args.to_brokers:
        encodings = prepare_outputs(cfg, night.alerts, inputs, configured_cutouts(cfg, inputs.reader), brokers,
                                    night.filters)
        kafka_rows(decided, brokers, encodings, None, None, writers=inputs.readable).write.format("kafka") \
            .options(**spark_sink_options(cfg)).mode("append").save()
    table = matches_table(cfg, args, name)
    rows = match_rows(decided, brokers)
    rows.write.format("delta").mode("overwrite").option("replaceWhere", f"night = '{args.night}'") \
        .partitionBy("night").save(str(table))
    by_broker = {r.broker: r["count"] for r in rows.groupBy("broker").count().collect()}
    summary = {"alerts": decided.count(), "matches": sum(by_broker.values()), "table": str(table),
               "by_broker": {b.name: by_broker.get(b.name, 0) for b in brokers}}
    decided.unpersist()
    return summary


def matches_table(cfg: Config, args: argparse.Namespace, name: str) -> Path:
    """Where re-filtered matches go and are read back from."""
    return Path(args.matches_table) if args.matches_table else cfg.delta_dir / name / "rematches"


def show_matches(spark, table: Path, night: str, limit: int) -> dict:
    """Read a night's re-filtered matches back: counts per broker and filter, then the first ``limit`` rows."""
    from skyfilter.plan.tables import is_table

    if not is_table(spark, table):
        raise SkyfilterError(f"no matches table at {table}: re-filter a night first (--filters-dir, --brokers)")
    rows = spark.read.format("delta").load(str(table)).where(F.col("night") == night)
    by_broker = {r.broker: r["count"] for r in rows.groupBy("broker").count().collect()}
    if not by_broker:
        raise SkyfilterError(f"{table} holds no matches of night {night}")
    by_filter = {r.filter: r["count"] for r in rows.select(F.explode("filters").alias("filter"))
                 .groupBy("filter").count().collect()}
    for broker, count in sorted(by_broker.items()):
        logger.info(f"  broker {broker}: {count} alerts")
    for name, count in sorted(by_filter.items()):
        logger.info(f"  filter {name}: {count} matches")
    for row in rows.orderBy("visit_id", "alert_id", "broker").limit(limit).collect():
        logger.info(f"  visit {row.visit_id} alert {row.alert_id} -> {row.broker} ({', '.join(row.filters)})"
            + watch_phrase(row.asDict().get("watch")))
    return {"matches": sum(by_broker.values()), "by_broker": by_broker, "by_filter": by_filter, "table": str(table)}


def watch_phrase(matches: list | None) -> str:
    """A match's watchlist and watchmap entries, as the end of its line."""
    parts = []
    for m in matches or []:
        if m["kind"] == "watchlist":
            parts.append(f"{m['name']} v{m['version']}: {m['source_id']} at {m['separation_arcsec']:.2f} arcsec")
        else:
            level = "" if m["credible_level"] is None else f" (credible level {m['credible_level']:.2f})"
            parts.append(f"in {m['name']} v{m['version']}{level}")
    return f" [{'; '.join(parts)}]" if parts else ""


def run(args: argparse.Namespace, spark=None) -> dict:
    """Replay or re-filter one night; returns the figures of the summary line."""
    cfg = act_as(config_from_args(args), "pipeline")
    name = args.name or cfg.topics.alerts
    speed = speed_factor(args.speed)
    if args.to_topic or args.to_brokers:
        check_reachable(cfg)
    spark = spark or get_spark(f"skyfilter-replay-{name}")
    if args.night == "last":
        args.night = last_night(spark, table_paths(cfg, name))
        logger.info(f"night {args.night}: the latest night in the archive '{name}'")
    selection = NightSelection(args.night, parse_visits(args.visits), args.as_of_version, args.as_of_timestamp)
    began = time.time()
    if args.show_matches and not args.filters_dir:
        result = show_matches(spark, matches_table(cfg, args, name), args.night, args.limit)
        logger.info(f"night {args.night}: {result['matches']} re-filtered matches in {result['table']}")
        return result
    messages, inputs = read_messages(spark, table_paths(cfg, name), selection)
    if messages.limit(1).count() == 0:
        raise SkyfilterError(f"the archive '{name}' has no alerts for night {args.night}")
    if args.to_topic:
        result = restream(cfg, messages, inputs, args.to_topic, speed, not args.no_progress)
        result["elapsed"] = time.time() - began
        logger.info(f"replayed {result['alerts']} alerts of night {args.night} ({result['visits']} visits) to "
                    f"'{args.to_topic}' in {result['elapsed']:.1f} s: "
                    f"{result['alerts'] / result['elapsed']:.0f} alerts/s")
    else:
        result = refilter(spark, cfg, messages, inputs, args, name)
        result["elapsed"] = time.time() - began
        for broker, count in result["by_broker"].items():
            logger.info(f"  broker {broker}: {count} alerts")
        logger.info(f"re-filtered {result['alerts']} alerts of night {args.night}: {result['matches']} matches "
                    f"in {result['elapsed']:.1f} s, written to {result['table']} (read them back: --show-matches)")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return job_main("replay_night", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
