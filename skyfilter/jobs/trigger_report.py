"""Latency and throughput per delivery trigger, from the streams' own Delta tables.

    spark-submit pipelines/trigger_report.py --names night_0s night_1s night_rt [--out report.md]

Run filter_stream.py on the same night (replayed with replay_night.py into
one topic per run) with different ``--trigger`` values (``realtime`` too) and
``--name``s; this reports, per stream: its delivery trigger, batches, alerts,
alerts/s from the first input append to the last delivery, and the latency of
every delivered match, input append time to the append time of its
delivery-log record (written with the broker message) p50/p95/p99/max.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from skyfilter.core.errors import SkyfilterError
from skyfilter.jobs.job_config import add_common_arguments, job_main
from skyfilter.local.arguments import config_from_args
from skyfilter.plan.tables import table_paths
from skyfilter.spark.session import get_spark

# One query per stream; {matches} and {metrics} are the stream's tables.
TRIGGER_QUERY = """
WITH delivery AS (
  SELECT stream, first(trigger) AS trigger, count(*) AS batches, sum(input_alerts) AS alerts
  FROM delta.`{metrics}` WHERE lane IN ('delivery', 'realtime') AND input_alerts > 0 GROUP BY stream
), latency AS (
  SELECT unix_millis(delivered_at) - unix_millis(kafka_timestamp) AS ms, kafka_timestamp, delivered_at
  FROM delta.`{matches}`
)
SELECT d.stream, d.trigger, d.batches, d.alerts,
       d.alerts / ((max(unix_millis(l.delivered_at)) - min(unix_millis(l.kafka_timestamp))) / 1000.0) AS alerts_per_s,
       percentile(l.ms, 0.50) AS p50_ms, percentile(l.ms, 0.95) AS p95_ms, percentile(l.ms, 0.99) AS p99_ms,
       max(l.ms) AS max_ms
FROM delivery d CROSS JOIN latency l
GROUP BY d.stream, d.trigger, d.batches, d.alerts
"""

COLUMNS = ["stream", "trigger", "batches", "alerts", "alerts_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"]


def trigger_rows(spark, cfg, names: list[str]) -> list[dict]:
    """One row per stream (and trigger) with its throughput and latency percentiles."""
    rows = []
    for name in names:
        tables = table_paths(cfg, name)
        for table in ("metrics", "matches"):
            if not (tables[table] / "_delta_log").exists():
                raise SkyfilterError(f"no {table} for stream '{name}' under {tables[table]}: has its archive lane run?")
        query = TRIGGER_QUERY.format(matches=tables["matches"], metrics=tables["metrics"])
        rows += [row.asDict() for row in spark.sql(query).collect()]
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    def cell(value):
        return f"{value:.0f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trigger_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", nargs="+", required=True, help="stream names (filter_stream.py --name)")
    parser.add_argument("--out", help="also write the Markdown table to this file")
    add_common_arguments(parser)
    args = parser.parse_args(argv)

    def work() -> None:
        table = markdown(trigger_rows(get_spark("skyfilter-trigger-report"), config_from_args(args), args.names))
        print(table)
        if args.out:
            Path(args.out).write_text(table + "\n")

    return job_main("trigger_report", work)


if __name__ == "__main__":
    sys.exit(main())
