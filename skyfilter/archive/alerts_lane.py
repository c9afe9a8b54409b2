"""The archive lane: every alert of a stream to Delta, exactly once, off the delivery path.

Two streaming queries, each with its own checkpoint, make the lane:

* this module's :class:`ArchiveLane` reads the input topic on a slower
  trigger (``archive.trigger``) in ``archive.tasks`` task(s) (default one), so it
  never holds more task slots than that (``skyfilter/plan/slots.py``).  Per batch it decodes each message once, as
  the delivery lane does (the cutouts stay in the original message, which is
  archived as it is), appends the accepted alerts to ``alerts``, the rare
  undecodable ones to ``rejects`` (each an idempotent append per batch), copies
  them to the nightly topics when those are on, and logs one ``batch`` record
  of its own figures to the delivery log;
* :class:`skyfilter.archive.log_lane.ArchiveLogLane` turns the delivery log into the
  ``matches``, ``metrics`` and ``broker_visits`` tables on a slower trigger
  still: a few small Delta commits per batch, which would otherwise cost the
  alerts query a second of every trigger.

The delivery lane never waits for any of this: a stopped or slow archive lane
catches up from its checkpoints.
"""

from __future__ import annotations

import itertools
import logging
import time

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from skyfilter.archive.layout import STATS_COLUMNS, archive_rows, index_paths, index_reader, is_raw, record_schema
from skyfilter.archive.nightly_topics import NightlyTopics
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.lane_names import LaneName
from skyfilter.filtering.decode import decode, is_accepted
from skyfilter.lanes.delivery_log import SummaryWriter, checkpoint_query_id
from skyfilter.lanes.lane import Lane, LaneServices
from skyfilter.plan.stream_plan import KAFKA_SOURCE_SCHEMA
from skyfilter.plan.tables import append, create_table, is_table, nullable
from skyfilter.spark.internals import observation_ready

logger = logging.getLogger(__name__)

LANE = LaneName.ARCHIVE
_observation_ids = itertools.count()


class ArchiveLane(Lane):
    """The ``foreachBatch`` function of the archive lane's query over the input topic."""

    def __init__(self, services: LaneServices, trigger: str, summaries: SummaryWriter):
        super().__init__(services, LANE)
        plan = services.cell.current
        self.trigger = trigger
        self.summaries = summaries
        self.app_id = f"skyfilter:{plan.name}:{LANE}"
        self.nightly = NightlyTopics(self.cfg, plan.topic) \
            if self.cfg.stream.nightly_topics.enabled else None
        self.merge_schema = False  # set when the table was written with an older reader schema
        self.raw = True  # the raw layout (message and index columns); False: an archive of decoded fields
        self.index_paths: list[str] = []  # the alert fields the raw layout decodes (prepare)
        self.readers: tuple = (None, "")  # (the input schemas, their index reader) of the last batch
        self.recorded: set[int] = set()  # ids of the writer schemas in the schemas table
        # original messages never repeat: Parquet's dictionary would only cost time to try
        self.spark.conf.set("parquet.enable.dictionary#kafka_value", "false")

    @property
    def topics(self) -> list[str]:
        """What the lane's query reads."""
        return [self.plan.topic]

    def prepare(self) -> None:
        """Create the alerts table and record the writer schema before the first alert comes."""
        path = self.plan.tables["alerts"]
        if is_table(self.spark, path) and "kafka_value" not in self.spark.read.format("delta").load(str(path)).columns:
            raise SkyfilterError(
                f"{path} is an archive of an earlier skyfilter (images in a separate cutouts table): "
                f"replay_night.py still reads it, but new alerts go to a new archive; start the stream with "
                f"another --name, or move {path.parent} away")
        if is_table(self.spark, path):
            self.raw = is_raw(self.spark.read.format("delta").load(str(path)))
            if not self.raw and self.cfg.archive.writer == "delta-rs":
                raise SkyfilterError(f"{path} holds decoded alert fields (the layout before the raw one), which "
                                     f"archive.writer delta-rs does not write: use archive.writer spark, or another "
                                     f"--name")
            if not self.raw:
                logger.info(f"archive lane: {path} holds decoded alert fields (the layout before the raw one): new "
                            f"alerts keep that layout")
        self.index_paths = index_paths(self.spark, self.plan.columns)
        empty = self._decode(self.spark.createDataFrame([], KAFKA_SOURCE_SCHEMA))
        self._record_schemas()
        columns = nullable(self._alerts(empty).schema)
        if is_table(self.spark, path):
            existing = self.spark.read.format("delta").load(str(path)).schema
            self.merge_schema = nullable(existing).simpleString() != columns.simpleString()
        create_table(self.spark, path, columns, "night", STATS_COLUMNS if self.raw else None)

    def _decode(self, batch: DataFrame) -> DataFrame:
        """The batch's messages decoded as the layout needs: the index fields alone (raw), or as filters see
        them."""
        if not self.raw:
            if self.readers[0] is None:
                self.readers = (self.plan.inputs, None)
            elif self.readers[0].reader != self.plan.inputs.reader:  # a newer version became the reader
                self.readers, self.merge_schema = (self.plan.inputs, None), True
            return self.plan.decode(batch)
        plan = self.plan
        if self.readers[0] is not plan.inputs:  # a new input schema version widened the reader
            self.readers = (plan.inputs, index_reader(plan.inputs.reader, self.index_paths))
        return decode(batch, plan.inputs, plan.columns, plan.night_offset_hours, plan.max_alert_bytes,
                      self.readers[1])

    def _record_schemas(self) -> None:
        """Keep each readable writer schema in the schemas table.  Every readable one, not only those this lane's
        own look adopted: in a driver shared with delivery, the lane that looks first adopts a new version for
        both (they share the plan)."""
        for schema_id, text in self.plan.inputs.readable.items():
            if schema_id not in self.recorded:
                record_schema(self.spark, self.plan.tables["schemas"], schema_id, text)
                self.recorded.add(schema_id)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.time()
        self.refresh_inputs()
        self.take_plan()
        self._record_schemas()
        decoded = self._decode(batch)
        observation = Observation(f"archive_{next(_observation_ids)}")
        append(self._alerts(decoded.observe(observation, *archive_figures())), self.plan.tables["alerts"],
               self.app_id, batch_id, "night", merge_schema=self.merge_schema)
        stats = self._stats(decoded, observation)
        if stats["rejected"]:
            self._append_rejects(decoded, batch_id)
        if self.nightly is not None and stats["nights"]:
            self.nightly.write(decoded.where(is_accepted()), self.kafka_options, stats["nights"],
                               self.plan.inputs.readable)
        finished = time.time()
        figures = self.monitor.batch_figures(LANE, batch_id, started, finished, stats["input_alerts"], [])
        if stats["input_alerts"]:
            self.summaries.write(self._summary(batch_id, started, finished, stats, figures))
        self._report(batch_id, started, finished, stats, figures)

    def _alerts(self, decoded: DataFrame) -> DataFrame:
        """The batch's ``alerts`` rows.  Nothing in them depends on the batch: Spark compiles the query's code
        once and reuses it (a literal such as the batch id would be compiled into the code of every batch)."""
        return archive_rows(decoded.where(is_accepted()), self.raw)

    def _stats(self, decoded: DataFrame, observation: Observation) -> dict:
        """Counts, nights and input append times of the batch's messages, as the alerts append observed them.

        A batch retried after a crash may find its alerts already committed: Delta then skips the append,
        nothing is observed, and the figures take a pass of their own.
        """
        row = observation.get if observation_ready(observation) else decoded.agg(*archive_figures()).first().asDict()
        return {"input_alerts": row["input"], "rejected": row["rejected"], "archived": row["input"] - row["rejected"],
                "appended_ms": row["q"] or [None, None, None], "first_ms": row["first"],
                "nights": sorted(night for night in row["nights"] if night)}

    def _append_rejects(self, decoded: DataFrame, batch_id: int) -> None:
        """The batch's undecodable messages, with their bytes and reason, appended once."""
        rejects = decoded.where(~is_accepted()).select(
            "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_value",
            "schema_id", "reject_reason", F.lit(batch_id).cast("long").alias("batch_id"))
        append(rejects, self.plan.tables["rejects"], self.app_id, batch_id)

    def _summary(self, batch_id: int, started: float, finished: float, stats: dict, figures: dict) -> dict:
        """This batch's ``batch`` record for the delivery log (the ``metrics`` row of lane ``archive``): latency
        here is input append time to archived."""
        (p50, p95, p99), slowest = archive_latency(stats, finished)
        query_id = checkpoint_query_id(self.plan.lane_checkpoint(LANE))
        return {"stream": self.plan.name, "lane": LANE, "query_id": query_id, "run_id": self.monitor.run_id,
                "batch_id": batch_id, "trigger": self.trigger,
                "started_at_ms": started * 1000, "delivered_at_ms": None, "finished_at_ms": finished * 1000,
                "input_alerts": stats["input_alerts"], "rejected": stats["rejected"], "archived": stats["archived"],
                "matches": None, "matches_by_broker": {}, "matches_by_filter": {}, "filter_errors": {},
                "latency_p50_ms": p50, "latency_p95_ms": p95, "latency_p99_ms": p99, "latency_max_ms": slowest,
                "input_rows_per_second": figures["input_rows_per_second"],
                "processed_rows_per_second": figures["processed_rows_per_second"],
                "kafka_lag": {str(k): v for k, v in figures["kafka_lag"].items()}, "quarantined_filters": [],
                "broker_visits": []}

    def _report(self, batch_id: int, started: float, finished: float, stats: dict, figures: dict) -> None:
        quantiles, slowest = archive_latency(stats, finished)
        self.monitor.observe_archive(batch_id, stats, figures, started, finished, quantiles, slowest)
        self.totals.add_archive(stats["archived"], finished)
        if stats["input_alerts"]:
            logger.info(f"archive batch {batch_id}: {stats['archived']} alerts archived, {stats['rejected']} rejected, "
                        f"done in {finished - started:.2f} s")


def archive_figures() -> list:
    """The aggregates an archive batch observes over its input messages."""
    accepted = is_accepted()
    millis = F.unix_millis("kafka_timestamp").cast("double")
    return [F.count(F.lit(1)).alias("input"), F.count_if(~accepted).alias("rejected"),
            F.percentile_approx(F.when(accepted, millis), [0.01, 0.05, 0.5], 10000).alias("q"),
            F.min(F.when(accepted, millis)).alias("first"),
            F.collect_set(F.when(accepted, F.col("night"))).alias("nights")]


def archive_latency(stats: dict, finished: float) -> tuple[list, float | None]:
    """([p50, p95, p99], max) in ms from the input append times of a batch's alerts to ``finished``."""
    ended_ms = finished * 1000.0
    quantiles = [None if q is None else ended_ms - q for q in reversed(stats["appended_ms"])]
    return quantiles, None if stats["first_ms"] is None else ended_ms - stats["first_ms"]
