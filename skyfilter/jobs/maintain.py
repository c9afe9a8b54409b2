"""Archive maintenance: compact finished nights, drop nights past the horizon, vacuum old files.

    spark-submit pipelines/maintain.py [--name alerts] [--night YYYY-MM-DD ...] [--vacuum-hours H] [--keep-nights D]

A stream writes a few small files per table per micro-batch; a night of
Rubin alerts would leave thousands.  ``OPTIMIZE`` rewrites each finished
night's partition into few large files (readers see the same rows),
``VACUUM`` deletes files no version within the retention still needs.
The report gives live files and bytes per table before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from pathlib import Path

from pyspark.sql import functions as F

from skyfilter.core.alert_columns import current_night
from skyfilter.core.errors import SkyfilterError
from skyfilter.jobs.job_config import add_common_arguments, job_main
from skyfilter.local.arguments import config_from_args
from skyfilter.plan.tables import table_paths
from skyfilter.spark.session import get_spark

logger = logging.getLogger("skyfilter.jobs.maintain")  # the same name when run as __main__

DELTA_MIN_RETENTION_HOURS = 168


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="maintain.py",
        description="Compact each finished night of the archive (OPTIMIZE per night partition), drop nights "
                    "older than a horizon, VACUUM unreferenced files; report files and bytes before/after.")
    parser.add_argument("--name", help="archive to maintain: the stream's name (default: topics.alerts)")
    parser.add_argument("--night", action="append", help="compact only this night (repeatable; default: every "
                                                         "night before tonight)")
    parser.add_argument("--vacuum-hours", type=float, help="VACUUM retention (default: maintenance."
                                                           "vacuum_retention_hours)")
    parser.add_argument("--keep-nights", type=int, help="drop nights older than this many days, 0 = keep all "
                                                        "(default: maintenance.keep_nights)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def table_size(spark, path: Path) -> tuple[int, int]:
    """(live files, bytes) of a Delta table's current version."""
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return int(detail.numFiles), int(detail.sizeInBytes)


def run(args: argparse.Namespace, spark=None) -> dict[str, dict]:
    """Maintain every table of one archive; returns per table: files/bytes before and after, nights."""
    from delta.tables import DeltaTable

    cfg = config_from_args(args)
    name = args.name or cfg.topics.alerts
    retention = args.vacuum_hours if args.vacuum_hours is not None else \
        cfg.maintenance.vacuum_retention_hours
    keep = args.keep_nights if args.keep_nights is not None else cfg.maintenance.keep_nights
    spark = spark or get_spark(f"skyfilter-maintain-{name}")
    if retention < DELTA_MIN_RETENTION_HOURS:
        # Delta refuses short retentions unless told: files older than that may still serve time travel.
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    tonight = current_night(cfg.stream.night_offset_hours)
    horizon = (dt.date.fromisoformat(tonight) - dt.timedelta(days=keep)).isoformat() if keep else None
    paths = table_paths(cfg, name)
    report = {}
    for table in cfg.maintenance.tables:
        path = paths[table]
        if not (path / "_delta_log").exists():
            continue
        delta = DeltaTable.forPath(spark, str(path))
        before = table_size(spark, path)
        partitioned = "night" in delta.detail().first().partitionColumns
        nights = []
        if partitioned:
            if horizon:
                delta.delete(F.col("night") < horizon)
            present = sorted(r.night for r in delta.toDF().select("night").distinct().collect() if r.night)
            nights = [n for n in present if (n in args.night if args.night else n < tonight)]
            for night in nights:
                delta.optimize().where(f"night = '{night}'").executeCompaction()
        delta.vacuum(retention)
        after = table_size(spark, path)
        report[table] = {"files_before": before[0], "bytes_before": before[1], "files_after": after[0],
                         "bytes_after": after[1], "nights": nights}
        logger.info(f"{table}: {before[0]} files, {before[1] / 1e6:.1f} MB -> {after[0]} files, "
                    f"{after[1] / 1e6:.1f} MB ({len(nights)} night(s) compacted"
                    f"{', dropped nights before ' + horizon if horizon else ''})")
    if not report:
        raise SkyfilterError(f"no archive tables under {paths['alerts'].parent}")
    logger.info(f"maintained {len(report)} table(s) of archive '{name}' (vacuum retention {retention:g} h)")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return job_main("maintain", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
