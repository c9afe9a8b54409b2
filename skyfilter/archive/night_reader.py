"""Reading one archived night back: alerts (optionally as of a version or time) with their original messages."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from skyfilter.archive.layout import archived_schemas, is_legacy, is_raw, restore_legacy_messages, with_fields
from skyfilter.core.errors import SkyfilterError
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.schemas.avro import cutout_fields, without_fields
from skyfilter.schemas.reader import reader_for


@dataclass
class NightSelection:
    """Which part of which version of the archive to read."""

    night: str
    visits: tuple[int, int] | None = None  # 1-based positions in the night's visit order, inclusive
    as_of_version: int | None = None
    as_of_timestamp: str | None = None


def parse_visits(text: str | None) -> tuple[int, int] | None:
    """'A-B' (or 'A') -> (A, B): visits by their position in the night, starting at 1."""
    if not text:
        return None
    first, _, last = text.partition("-")
    try:
        span = (int(first), int(last or first))
    except ValueError:
        raise SkyfilterError(f"--visits expects A-B (positions in the night, from 1), got '{text}'") from None
    if span[0] < 1 or span[1] < span[0]:
        raise SkyfilterError(f"--visits {text}: expected 1 <= A <= B")
    return span


def last_night(spark: SparkSession, tables: dict) -> str:
    """The latest night the archive holds (its partitions' values: no data file is read)."""
    path = tables["alerts"]
    if not (path / "_delta_log").exists():
        raise SkyfilterError(f"no archive at {path}: has the stream run on this topic?")
    latest = spark.read.format("delta").load(str(path)).agg(F.max("night").alias("night")).first()["night"]
    if latest is None:
        raise SkyfilterError(f"the archive at {path} holds no alerts yet")
    return latest


def read_alerts(spark: SparkSession, tables: dict, selection: NightSelection) -> DataFrame:
    """The archived alerts of a night (time travel on the alerts table when asked)."""
    path = tables["alerts"]
    if not (path / "_delta_log").exists():
        raise SkyfilterError(f"no archive at {path}: has the stream run on this topic?")
    reader = spark.read.format("delta")
    if selection.as_of_version is not None:
        reader = reader.option("versionAsOf", selection.as_of_version)
    elif selection.as_of_timestamp is not None:
        reader = reader.option("timestampAsOf", selection.as_of_timestamp)
    alerts = reader.load(str(path)).where(F.col("night") == selection.night)
    if selection.visits:
        order = (alerts.groupBy("visit_id").agg(F.min("kafka_timestamp").alias("start"))
                 .orderBy("start").collect())
        wanted = [row.visit_id for row in order[selection.visits[0] - 1: selection.visits[1]]]
        if not wanted:
            raise SkyfilterError(f"night {selection.night} has {len(order)} visit(s); --visits asks for "
                                 f"{selection.visits[0]}-{selection.visits[1]}")
        alerts = alerts.where(F.col("visit_id").isin(wanted))
    return alerts


def read_messages(spark: SparkSession, tables: dict, selection: NightSelection) -> tuple[DataFrame, InputSchemas]:
    """The night's alerts with their original messages (``kafka_value``) and their fields as filters see them
    (cutouts left out), and their writer schemas (oldest first) with the reader schema they read as together.

    The raw layout's fields are decoded from the messages here.  An archive of the earliest layout gets its
    messages restored from its fields and ``cutouts`` table, with a ``byte_identical`` column saying whether
    each matches the hash stored when it was archived.
    """
    alerts = read_alerts(spark, tables, selection)
    ids = [row.schema_id for row in alerts.groupBy("schema_id").agg(F.min("kafka_timestamp").alias("first"))
           .orderBy("first").collect()]
    writers = archived_schemas(spark, tables["schemas"], ids)
    if is_legacy(alerts):
        (schema_id, schema_json), = writers.items()
        images = spark.read.format("delta").load(str(tables["cutouts"])).where(F.col("night") == selection.night)
        alerts = restore_legacy_messages(alerts, images, schema_json, schema_id)
    reader, unreadable = reader_for([(i, json.loads(text)) for i, text in writers.items()])
    readable = {i: text for i, text in writers.items() if i not in unreadable}
    if is_raw(alerts):
        alerts = with_fields(alerts, readable, without_fields(reader, cutout_fields(reader), suffix=None))
    return alerts, InputSchemas(str(tables["alerts"]), reader, readable, unreadable)
