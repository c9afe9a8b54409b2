"""Latency and throughput per trigger, from the streams' own Delta tables.

    spark-submit pipelines/trigger_report.py --names night_0s night_1s night_5s [--out report.md]

Run filter_stream.py on the same night (replayed with replay_night.py into
one topic per run) with different ``--trigger`` values and ``--name``s; this
joins each archived alert to its batch's delivery time and reports, per
stream: trigger, batches, alerts, sustained alerts/s, and per-alert latency
(input append time -> batch delivered) p50/p95/p99/max.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.job_config import add_common_arguments, config_from_args, job_main  # noqa: E402
from pipelines.session import get_spark  # noqa: E402
from pipelines.tables import table_paths  # noqa: E402
from skyfilter.errors import SkyfilterError  # noqa: E402

# One query per stream; {alerts} and {metrics} are the stream's tables.
TRIGGER_QUERY = """
SELECT m.stream, m.trigger,
       count(DISTINCT m.batch_id)                                   AS batches,
       count(*)                                                     AS alerts,
       count(*) / ((max(unix_millis(m.finished_at)) - min(unix_millis(m.started_at))) / 1000.0) AS alerts_per_s,
       percentile(unix_millis(m.delivered_at) - unix_millis(a.kafka_timestamp), 0.50) AS p50_ms,
       percentile(unix_millis(m.delivered_at) - unix_millis(a.kafka_timestamp), 0.95) AS p95_ms,
       percentile(unix_millis(m.delivered_at) - unix_millis(a.kafka_timestamp), 0.99) AS p99_ms,
       max(unix_millis(m.delivered_at) - unix_millis(a.kafka_timestamp))             AS max_ms
FROM delta.`{alerts}` a JOIN delta.`{metrics}` m ON a.batch_id = m.batch_id
GROUP BY m.stream, m.trigger
"""

COLUMNS = ["stream", "trigger", "batches", "alerts", "alerts_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"]


def trigger_rows(spark, cfg, names: list[str]) -> list[dict]:
    """One row per stream (and trigger) with its throughput and latency percentiles."""
    rows = []
    for name in names:
        tables = table_paths(cfg, name)
        if not (tables["metrics"] / "_delta_log").exists():
            raise SkyfilterError(f"no metrics for stream '{name}' under {tables['metrics']}")
        query = TRIGGER_QUERY.format(alerts=tables["alerts"], metrics=tables["metrics"])
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
