"""Where a batch's time goes: each stage of the stream's hot path timed alone, in Spark, on the same alerts.

    python -m bench.stages [--alerts 2000] [--repeats 3]

One topic of simulated Rubin alerts, then Spark batch jobs over it (best of
``--repeats``), each adding one stage to the one before:

1. Kafka read (Spark's Kafka source with Kafka's default consumer settings:
   64 KB socket buffer, fetches waiting up to 500 ms at the broker);
2. Kafka read with ``stream.source_options`` (OS-sized buffer, 10 ms fetch wait);
3. + decode as the delivery lane does: ``from_avro`` with the reader schema
   that leaves the cutouts out;
4. + decode as the archive lane does: every field, cutouts included;
5. + archive: the decoded alerts written as a Delta table;
6. Kafka sink: the same messages written to a topic by Spark (acks=all, idempotent);
7. the ``nocutouts`` re-encode: the stream's decode, then a ``nocutouts`` broker's message
   made by its own encoding (the alert without its cutouts, ``to_avro`` again);
8. the delivery lane's evaluation with the project's own ``filters/`` and
   ``conf/brokers.yaml``, its SQL filters alone (their brokers only);
9. the same with every filter (SQL and Python): decode, filters, broker matches;
10. the delivery lane's whole batch query (``skyfilter/delivery/program.py``):
   9 + the batch's observed figures, the per-visit caps and the Kafka rows, to
   Spark's ``noop`` sink (so the rows are computed, not sent).

The differences between rows are the stages' costs.  Writes ``stages.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from bench.harness import ROOT, add_common_arguments, runs_table, settings_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.stages",
                                     description="Each stage of the stream's hot path timed alone in Spark.")
    parser.add_argument("--alerts", type=int, default=2000, help="alerts in the topic (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per stage; the best counts (default 3)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from bench.alert_cache import CachedSource, cached_visits
    from bench.harness import bench_kafka, bench_schema, driver_and_kafka
    from bench.report import write_results
    from skyfilter.delivery.caps import VisitCaps
    from skyfilter.delivery.program import DeliveryProgram, evaluate
    from skyfilter.kafka.clients import spark_sink_options, spark_source_options
    from skyfilter.kafka.topics import ensure_topics
    from skyfilter.plan.stream_files import read_stream_files
    from skyfilter.plan.stream_plan import build_plan, reader_schema_json
    from skyfilter.producers.command import send_source
    from skyfilter.registry.client import open_registry, subject_for
    from skyfilter.schemas.avro import cutout_fields
    from skyfilter.schemas.wire import HEADER_SIZE
    from skyfilter.spark.session import get_spark

    run_id = time.strftime("%Y%m%d%H%M%S")
    topic = f"bench.stages.{run_id}"
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, 1, args.alerts, args.stamps, progress=not args.quiet)
        report = send_source(cfg, topic, CachedSource(cached), schema, 0.0, 2, not args.quiet)
        spark = get_spark("skyfilter-bench-stages")
        scratch = args.state_dir / f"stages_{run_id}"
        def source(options: dict | None = None):
            return (spark.read.format("kafka").options(**spark_source_options(cfg)).option("subscribe", topic)
                    .options(**(options or {})).load())

        lean = reader_schema_json(schema, cutout_fields(schema))

        def decoded(options: dict | None = None):
            body = F.expr(f"substring(value, {HEADER_SIZE + 1})")
            return source().select(from_avro(body, json.dumps(schema), options or {}).alias("alert")).select("alert.*")

        def archive():
            shutil.rmtree(scratch, ignore_errors=True)
            decoded().write.format("delta").save(str(scratch))

        ensure_topics(cfg, {f"{topic}.copy": cfg.topics.alerts_partitions})

        def sink():
            (source().select("key", "value").write.format("kafka").options(**spark_sink_options(cfg))
             .option("topic", f"{topic}.copy").mode("append").save())

        plan = build_plan(spark, cfg, topic, topic, read_stream_files(ROOT / "filters", ROOT / "conf" / "brokers.yaml"),
                          open_registry(cfg).latest(subject_for(topic)))
        program = DeliveryProgram(spark, plan, plan.brokers, dead_letters=True)
        kinds = {spec.name: spec.kind for spec in plan.filters}
        sql_brokers = [b for b in plan.brokers if all(kinds[name] == "sql" for name in b.enabled_filters)]

        nocutouts = next(plan.encodings[b.name] for b in plan.brokers if b.format == "nocutouts")

        def reencoded():
            return plan.decode(source()).select(F.length(nocutouts.value()).alias("bytes")).agg(
                F.sum("bytes")).collect()

        def to_noop(frame) -> None:
            frame.write.format("noop").mode("overwrite").save()

        defaults = {"kafka.receive.buffer.bytes": "65536", "kafka.fetch.max.wait.ms": "500"}
        stages = [("Kafka read, Kafka's default consumer settings", lambda: source(defaults).count()),
                  ("Kafka read, stream.source_options", lambda: source().count()),
                  ("+ from_avro, reader schema without cutouts (delivery)",
                   lambda: decoded({"avroSchema": lean}).agg(F.count("diaSource.snr")).collect()),
                  ("+ from_avro, every field (archive)", lambda: decoded().agg(F.count("diaSource.snr")).collect()),
                  ("+ Delta archive write", archive),
                  ("Kafka read + Kafka sink write", sink),
                  ("stream decode + a nocutouts broker's message (to_avro without cutouts)", reencoded),
                  ("delivery lane: decode + the SQL filters of filters/ + broker matches",
                   lambda: to_noop(evaluate(plan, source(), sql_brokers))),
                  ("delivery lane: decode + filters/ (SQL and Python) + broker matches",
                   lambda: to_noop(evaluate(plan, source(), plan.brokers))),
                  ("delivery lane: whole batch query (+ figures, caps, Kafka rows)",
                   lambda: to_noop(program.apply(source(), 0, VisitCaps())[0]))]
        rows = []
        with driver_and_kafka(spark, cluster) as memory:
            for label, action in stages:
                times = []
                for _ in range(args.repeats):
                    began = time.time()
                    action()
                    times.append(time.time() - began)
                best = min(times)
                rows.append({"stage": label, "best_s": round(best, 2), "alerts_per_s": round(args.alerts / best),
                             "mb_per_s": round(report.bytes / 1e6 / best)})
        shutil.rmtree(scratch, ignore_errors=True)
    notes = [f"{report.alerts} simulated Rubin alerts ({'with' if args.stamps else 'without'} cutouts, "
             f"{report.bytes / 1e6:,.0f} MB), best of {args.repeats}; Spark local[2]. Each row is one Spark job "
             "(job scheduling included), so the differences between rows are the stages' costs."]
    columns = [("stage", "stage"), ("best_s", "s"), ("alerts_per_s", "alerts/s"), ("mb_per_s", "MB/s")]
    return write_results(args.results, "stages", "Where the time goes: the hot path's stages in Spark", rows,
                         columns, notes, settings_of(args), args.command, _plot(rows),
                         memory.peaks(), runs_table(args), memory.peak_breakdown())


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.2))
    axis.barh([r["stage"] for r in rows][::-1], [r["best_s"] for r in rows][::-1], color="tab:blue")
    axis.set_xlabel("seconds for the whole topic")
    axis.set_title("Stages of the hot path")
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.stages", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
