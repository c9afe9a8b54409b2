"""Producer: serialize-and-send alerts/s of one Python producer process, simulated and real Rubin alerts.

    python -m bench.producer_rate [--alerts 5000] [--real samples/lsst-v10]

Four runs of ``--alerts`` alerts each, one producer process, the project's
producer settings (``conf/local.yaml`` ``producer``):

* simulated, fresh: simulate + serialize with fastavro + send (``skyfilter produce``);
* simulated, pre-serialized: send alerts made beforehand (``bench/alert_cache.py``);
* real, pre-serialized replay: the real Rubin alerts' bytes as stored, cycled to ``--alerts``;
* real, fresh serialization: the same alerts decoded once, serialized again for every send.

Rate = alerts / (first send to the last acknowledgement).  DMTN-028 measured
about 300 alerts/s per Python producer.  Writes ``producer_rate.{json,csv,md,png}``.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.harness import ROOT, add_common_arguments, runs_table, settings_of
from skyfilter.producers.produce import AlertSource

DMTN_028_RATE = 300


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.producer_rate",
        description="Alerts/s one Python producer process serializes and sends, simulated and real alerts.")
    parser.add_argument("--alerts", type=int, default=5000, help="alerts per run (default 5000)")
    parser.add_argument("--real", type=Path, default=ROOT / "samples" / "lsst-v10",
                        help="folder or file of real Rubin alerts (Avro container files)")
    add_common_arguments(parser)
    return parser.parse_args(argv)


class CycledFileSource(AlertSource):
    """Real alerts from Avro files, cycled to ``alerts``; sent as stored, or serialized again each time."""

    def __init__(self, paths: list[Path], alerts: int, fresh: bool):
        from skyfilter.producers.sources import FileSource

        self.files = FileSource(paths)
        self.schema = self.files.schema
        self.fresh = fresh
        self.visits, self.alerts_per_visit = 1, alerts
        self.schema_id = 0
        self._records: list[dict] = []

    def prepare(self, share: int, shares: int) -> None:
        if self.fresh:
            import fastavro
            from fastavro.schema import parse_schema

            self._parsed = parse_schema(self.schema)
            self._records = [fastavro.schemaless_reader(io.BytesIO(body), self._parsed, None)
                             for body in self.files.bodies]

    def messages(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        import fastavro

        from skyfilter.schemas.wire import frame

        bodies, keys = self.files.bodies, self.files.keys
        buffer = io.BytesIO()
        for index in range(share, self.alerts_per_visit, shares):
            position = index % len(bodies)
            if self.fresh:
                buffer.seek(0)
                buffer.truncate()
                fastavro.schemaless_writer(buffer, self._parsed, self._records[position])
                body = buffer.getvalue()
            else:
                body = bodies[position]
            yield keys[position], frame(self.schema_id, body)


def run(args: argparse.Namespace) -> dict[str, Path]:
    """Run the benchmark; returns the result files."""
    from bench.alert_cache import CachedSource, cached_visits
    from bench.harness import bench_kafka, bench_schema, kafka_pid
    from bench.report import write_results
    from skyfilter.local.memory import RssSampler, own_rss_mb
    from skyfilter.producers.command import send_source
    from skyfilter.producers.sources import SimulatedSource

    run_id = time.strftime("%Y%m%d%H%M%S")
    rows = []
    with bench_kafka(args.state_dir, args.bootstrap) as (cfg, cluster):
        schema = bench_schema(cfg)
        cached = cached_visits(args.state_dir / "cache", schema, 1, args.alerts, args.stamps, progress=not args.quiet)
        real_files = [args.real]
        runs = [("simulated", "fresh: simulate + serialize + send", schema,
                 SimulatedSource(schema, 0, "2026-11-21", 1, args.alerts, seed=5, stamps=args.stamps)),
                ("simulated", "pre-serialized: send only", schema, CachedSource(cached))]
        for fresh in (False, True):
            source = CycledFileSource(real_files, args.alerts, fresh)
            runs.append((f"real Rubin ({len(source.files.bodies)} alerts cycled)",
                         "fresh serialization + send" if fresh else "pre-serialized replay: send only",
                         source.schema, source))
        with RssSampler({"kafka": kafka_pid(cluster)}) as memory:
            for index, (alerts, mode, alert_schema, source) in enumerate(runs):
                report = send_source(cfg, f"bench.producer.{run_id}.{index}", source, alert_schema, 0.0, 1,
                                     not args.quiet)
                visit = report.visits[0]
                rows.append({"alerts": alerts, "mode": mode, "sent": visit.alerts,
                             "kb_per_alert": round(visit.bytes / max(visit.alerts, 1) / 1024, 1),
                             "seconds": round(visit.seconds, 2), "alerts_per_s": round(visit.alerts / visit.seconds),
                             "mb_per_s": round(visit.bytes / 1e6 / visit.seconds, 1),
                             "x_dmtn_028": round(visit.alerts / visit.seconds / DMTN_028_RATE, 2),
                             "failed": visit.failures})
    notes = [f"One producer process, the project's librdkafka producer settings (acks=all, idempotent, "
             f"linger {cfg.get('producer')['linger.ms']} ms); simulated alerts "
             f"{'with' if args.stamps else 'without'} cutouts; real alerts from {args.real}.",
             f"x DMTN-028: the rate over DMTN-028's ~{DMTN_028_RATE} alerts/s per Python producer process."]
    columns = [("alerts", "alerts"), ("mode", "mode"), ("sent", "sent"), ("kb_per_alert", "KB/alert"),
               ("seconds", "s"), ("alerts_per_s", "alerts/s"), ("mb_per_s", "MB/s"),
               ("x_dmtn_028", "x DMTN-028"), ("failed", "failed")]
    peaks = {"producer (this process)": own_rss_mb(), "kafka": memory.peak("kafka")}
    return write_results(args.results, "producer_rate", "Producer: alerts/s per Python process", rows, columns,
                         notes, settings_of(args), args.command, _plot(rows), peaks, runs_table(args))


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['alerts'].split(' (')[0]}\n{'fresh' if r['mode'].startswith('fresh') else 'pre-serialized'}"
              for r in rows]
    axis.bar(labels, [r["alerts_per_s"] for r in rows], color="tab:blue")
    axis.axhline(DMTN_028_RATE, color="tab:red", linestyle=":", label="DMTN-028 (~300/s)")
    axis.set_ylabel("alerts / s, one process")
    axis.legend()
    axis.tick_params(axis="x", labelsize="small")
    return figure


def main(argv: list[str] | None = None) -> int:
    from bench.harness import bench_main

    return bench_main("bench.producer_rate", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
