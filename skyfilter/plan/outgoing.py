"""What the delivery lane sends for a batch of alerts: broker messages, dead letters and its log, in one pass.

Every alert's filter verdicts become, per broker, the names of the broker's
filters it matched (:func:`add_broker_matches`).  The per-visit caps
(``skyfilter/delivery/caps.py``) then say which of those matches are kept.  Finally each
alert becomes an array of Kafka rows, exploded into what one Kafka sink writes
(:func:`kafka_rows`; a ``topic`` column picks each row's topic):

* one message per broker it goes to: ``full`` sends the input bytes unchanged,
  ``nocutouts`` and ``lite`` re-encode the alert under their own registered
  schema, each in the broker's wire layout (:class:`Encoding`); headers
  ``filters`` (matched filter names, comma-separated), ``alert_id`` (for
  de-duplication) and ``input_time`` (input Kafka timestamp, ms);
* a dead letter if it did not decode: key and bytes unchanged, headers
  ``reason``, ``source_topic``, ``source_partition``, ``source_offset``,
  ``source_timestamp``;
* one delivery-log record (JSON) if it went to any broker: which brokers, which
  filters, and its Kafka position; the archive lane turns these into the
  ``matches`` table, and the record's own append time is the delivery time;
  a dead letter's record (lane, reason, position) tells the stream's monitor
  of it (the dead-letter topic is shared by the streams of an input topic).

Neither a WHERE nor a lambda touches the decoded fields, so Spark decodes each
alert once (``tests/test_stream_plan.py`` checks the optimized plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.avro.functions import to_avro

from skyfilter.core.brokers import BrokerSpec
from skyfilter.filtering.decode import is_accepted
from skyfilter.filtering.filter_eval import filter_column
from skyfilter.filtering.input_schemas import per_writer
from skyfilter.schemas.wire import HEADER_SIZE, frame
from skyfilter.spark.steps import Step, apply_steps, select, with_columns
from skyfilter.watch.columns import WATCH_MATCHES_DDL

HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                         T.StructField("value", T.BinaryType())]))
LOG_KIND_MATCH = "match"
LOG_KIND_DEAD_LETTER = "dead_letter"
MATCHED_FIELD = "matched_filters"  # in a ``lite`` record: the broker's filters the alert matched
WATCH_HEADER = "watch"  # the alert's watchlist/watchmap matches (JSON), to brokers whose filters use them
BATCH_ID_COLUMN = "_batch_id"  # read by the delivery-log records of a batch


@dataclass(frozen=True)
class Encoding:
    """How a broker's messages are made: a record schema, the columns that fill it, and the wire layout.

    ``wire`` is the broker's ``encoding`` (``skyfilter/core/brokers.py``): ``confluent``
    (magic byte, schema id, Avro body), ``fink`` (Avro body alone, the schema as
    the message key) or ``json``.  An ``original`` encoding resends the input's
    Avro body (a ``full`` broker in Fink's layout): its key is the writer schema
    of each message.
    """

    schema_json: str
    schema_id: int
    columns: tuple[tuple[str, str], ...]  # (field name, SQL expression over the alert's columns)
    names_matches: bool = False  # a last field (MATCHED_FIELD) lists the broker's filters the alert matched
    wire: str = "confluent"
    original: bool = False

    def value(self, matched: Column | None = None) -> Column:
        """The message value of one alert under this encoding (``matched``: comma-joined filter names)."""
        if self.original:
            return F.expr(f"substring(kafka_value, {HEADER_SIZE + 1})")
        fields = [F.expr(expression).alias(name) for name, expression in self.columns]
        if self.names_matches:
            fields.append(filter_names(matched).alias(MATCHED_FIELD))
        if self.wire == "json":
            return F.encode(F.to_json(F.struct(*fields), {"ignoreNullFields": "false"}), "UTF-8")
        body = to_avro(F.struct(*fields), self.schema_json)
        return body if self.wire == "fink" else F.concat(F.lit(bytearray(frame(self.schema_id, b""))), body)

    def key(self, writers: dict[int, str]) -> Column | None:
        """The message key under this encoding, or None to keep the input's (the alert id).

        Fink's layout carries the value's schema in the key; for an ``original``
        encoding that is the writer schema of each message (``writers``: id -> text).
        """
        if self.wire != "fink":
            return None
        if not self.original:
            return F.lit(self.schema_json.encode())
        return per_writer(F.col("schema_id"), {i: F.lit(text.encode()) for i, text in writers.items()})


def filter_names(matched: Column) -> Column:
    """The comma-joined names of matched filters as a (never null) array of names."""
    return F.coalesce(F.split(matched, ","), F.array().cast("array<string>"))


def live_brokers(brokers: list[BrokerSpec]) -> list[tuple[int, BrokerSpec]]:
    """(slot, broker) of every broker with at least one working filter; the slot names its columns."""
    return [(slot, broker) for slot, broker in enumerate(brokers) if broker.enabled_filters]


def matched_filters(slot: int) -> str:
    """Column of a broker's matched filter names, comma-separated (null when none matched)."""
    return f"_matched_{slot}"


def kept(slot: int) -> str:
    """Column saying whether the alert goes to the broker (matched, and within its per-visit cap)."""
    return f"_keep_{slot}"


def add_broker_matches(evaluated: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
    """Add, per live broker, the names of its filters the alert matched (null when none did)."""
    return apply_steps(evaluated, [broker_match_step(brokers)])


def broker_match_step(brokers: list[BrokerSpec]) -> Step:
    """The step of :func:`add_broker_matches`, to build once and apply to many batches."""
    columns = {}
    for slot, broker in live_brokers(brokers):
        names = F.concat_ws(",", *[F.when(F.col(filter_column(f)), F.lit(f)) for f in broker.enabled_filters])
        columns[matched_filters(slot)] = F.when(names != "", names)
    return with_columns(columns)


def any_match(brokers: list[BrokerSpec]) -> Column:
    """True when the alert matched at least one broker (before caps)."""
    return any_of([F.col(matched_filters(slot)).isNotNull() for slot, _ in live_brokers(brokers)])


def any_of(flags: list[Column]) -> Column:
    """True when any flag is (false for no flags at all)."""
    return F.greatest(*flags, F.lit(False)) if flags else F.lit(False)


def keep_every_match(frame_: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
    """Mark every match as kept (no broker is capped)."""
    return apply_steps(frame_, [keep_every_match_step(brokers)])


def keep_every_match_step(brokers: list[BrokerSpec]) -> Step:
    """The step of :func:`keep_every_match`."""
    return with_columns({kept(slot): F.col(matched_filters(slot)).isNotNull() for slot, _ in live_brokers(brokers)})


def _header(key: str, value: Column) -> Column:
    return F.struct(F.lit(key).alias("key"), F.encode(value, "UTF-8").alias("value"))


def _row(topic: Column, key: Column, value: Column, headers: Column) -> Column:
    return F.struct(topic.alias("topic"), key.alias("key"), value.alias("value"), headers.alias("headers"))


def _broker_message(slot: int, broker: BrokerSpec, value: Column, key: Column | None) -> Column:
    headers = [_header("filters", F.col(matched_filters(slot))), _header("alert_id", F.col("alert_id")),
               _header("input_time", F.unix_millis("kafka_timestamp").cast("string"))]
    if broker.watch_matches:  # the alert's watchlist and watchmap matches, as JSON
        headers.append(_header(WATCH_HEADER, F.to_json(F.expr(broker.watch_matches))))
    headers = F.array(*headers)
    return F.when(F.col(kept(slot)), _row(F.lit(broker.topic), F.col("kafka_key") if key is None else key, value,
                                          headers))


def _dead_letter(topic: str) -> Column:
    headers = F.array(
        _header("reason", F.col("reject_reason")),
        _header("source_topic", F.col("kafka_topic")),
        _header("source_partition", F.col("kafka_partition").cast("string")),
        _header("source_offset", F.col("kafka_offset").cast("string")),
        _header("source_timestamp", F.unix_millis("kafka_timestamp").cast("string")),
    )
    return F.when(~is_accepted(), _row(F.lit(topic), F.col("kafka_key"), F.col("kafka_value"), headers))


def _dead_letter_record(lane: str) -> Column:
    """The JSON of a delivery-log ``dead_letter`` record (its lane and reason), null for decoded alerts."""
    return F.when(~is_accepted(), F.to_json(F.struct(
        F.lit(LOG_KIND_DEAD_LETTER).alias("kind"), F.lit(lane).alias("lane"), F.col("reject_reason").alias("reason"),
        "kafka_partition", "kafka_offset")))


def _broker_entries(brokers: list[BrokerSpec]) -> Column:
    """The brokers an alert went to, as structs (broker, topic, format, filters)."""
    return F.array_compact(F.array(*[
        F.when(F.col(kept(slot)), F.struct(F.lit(b.name).alias("broker"), F.lit(b.topic).alias("topic"),
                                           F.lit(b.format).alias("format"),
                                           F.col(matched_filters(slot)).alias("filters"),
                                           (F.to_json(F.expr(b.watch_matches)) if b.watch_matches
                                            else F.lit(None).cast("string")).alias("watch")))
        for slot, b in live_brokers(brokers)]))


def _log_record(topic: str, brokers: list[BrokerSpec], lane: str, went_anywhere: Column) -> Column:
    record = F.struct(F.lit(LOG_KIND_MATCH).alias("kind"), F.lit(lane).alias("lane"),
                      F.col(BATCH_ID_COLUMN).alias("batch_id"),
                      "night", "visit_id", "alert_id", "kafka_topic", "kafka_partition", "kafka_offset",
                      F.unix_millis("kafka_timestamp").alias("kafka_timestamp_ms"),
                      _broker_entries(brokers).alias("brokers"))
    return F.when(went_anywhere, _row(F.lit(topic), F.col("kafka_key"), F.to_json(record).cast("binary"),
                                      F.array().cast(HEADERS_TYPE)))


def kafka_rows(decided: DataFrame, brokers: list[BrokerSpec], encodings: dict[str, Encoding],
               deadletter_topic: str | None, log_topic: str | None, batch_id: int = -1, lane: str = "delivery",
               writers: dict[int, str] | None = None) -> DataFrame:
    """The rows one Kafka sink writes for alerts whose ``kept`` columns are set: topic, key, value, headers.

    Each re-encoding is computed once per alert, and only for alerts that some
    broker using it keeps.  Without ``deadletter_topic`` undecodable messages are
    left to another lane; without ``log_topic`` no delivery-log records are written.
    ``writers`` (input schema id -> text) are the keys of ``full`` brokers in Fink's layout.
    """
    return apply_steps(with_batch_id(decided, batch_id),
                       kafka_row_steps(brokers, encodings, deadletter_topic, log_topic, lane, writers))


def with_batch_id(decided: DataFrame, batch_id: int) -> DataFrame:
    """The column :func:`kafka_row_steps` reads the batch id of the delivery-log records from."""
    return decided.withColumn(BATCH_ID_COLUMN, F.lit(str(batch_id)).cast("long"))


def kafka_row_steps(brokers: list[BrokerSpec], encodings: dict[str, Encoding], deadletter_topic: str | None,
                    log_topic: str | None, lane: str = "delivery", writers: dict[int, str] | None = None
                    ) -> list[Step]:
    """The steps of :func:`kafka_rows` (after :func:`with_batch_id`), to build once and apply to many batches."""
    return [encode_step(brokers, encodings),
            *message_steps(brokers, encodings, deadletter_topic, log_topic, lane, writers)]


def encode_step(brokers: list[BrokerSpec], encodings: dict[str, Encoding], decided: bool = True) -> Step:
    """The first step of :func:`kafka_row_steps`: each re-encoding the alerts need, once per alert.

    ``decided``: only for alerts some broker using it keeps (the ``kept`` columns are
    set); else, before the caps, for those it matched.  After this step,
    :func:`message_steps` reads no field of the decoded alert, so a query may drop
    them (``skyfilter/delivery/program.py`` does, before its ``observe``).
    """
    def wanted(slot: int) -> Column:
        return F.col(kept(slot)) if decided else F.col(matched_filters(slot)).isNotNull()

    return with_columns({
        name: F.when(any_of([wanted(slot) for slot in users]), encoding.value(F.col(matched_filters(users[0]))))
        for encoding, (name, users) in _encoded_columns(live_brokers(brokers), encodings).items()})


def message_steps(brokers: list[BrokerSpec], encodings: dict[str, Encoding], deadletter_topic: str | None,
                  log_topic: str | None, lane: str = "delivery", writers: dict[int, str] | None = None,
                  log_values: tuple[tuple[str, Column], ...] = ()) -> list[Step]:
    """The rest of :func:`kafka_row_steps`: each alert's Kafka rows, exploded into the sink's columns.

    ``log_values``: further delivery-log records, (key, value) where the value is not null.
    """
    live = live_brokers(brokers)
    values = {slot: F.col("kafka_value") for slot, _ in live}
    for name, users in _encoded_columns(live, encodings).values():
        values |= {slot: F.col(name) for slot in users}
    went_anywhere = any_of([F.col(kept(slot)) for slot, _ in live])
    keys = {slot: encodings[b.name].key(writers or {}) if b.name in encodings else None for slot, b in live}
    rows = [_broker_message(slot, broker, values[slot], keys[slot]) for slot, broker in live]
    if deadletter_topic:
        rows.append(_dead_letter(deadletter_topic))
    if log_topic:
        rows.append(_log_record(log_topic, brokers, lane, went_anywhere))
        if deadletter_topic:  # the stream's own note of it (the dead-letter topic is shared by every stream)
            log_values = (*log_values, (LOG_KIND_DEAD_LETTER, _dead_letter_record(lane)))
        rows += [F.when(value.isNotNull(), _row(F.lit(log_topic), F.lit(key).cast("binary"), value.cast("binary"),
                                                 F.array().cast(HEADERS_TYPE))) for key, value in log_values]
    return [select(F.explode(F.array_compact(F.array(*rows))).alias("out")), select("out.*")]


def _encoded_columns(live: list[tuple[int, BrokerSpec]], encodings: dict[str, Encoding]
                     ) -> dict[Encoding, tuple[str, list[int]]]:
    """Each distinct re-encoding of these brokers: its column name and the slots of the brokers using it."""
    encoded: dict[Encoding, tuple[str, list[int]]] = {}
    for slot, broker in live:
        encoding = encodings.get(broker.name)
        if encoding is not None:
            encoded.setdefault(encoding, (f"_encoded_{len(encoded)}", []))[1].append(slot)
    return encoded


def match_rows(decided: DataFrame, brokers: list[BrokerSpec]) -> DataFrame:
    """One row per kept (alert, broker) match: what the ``matches`` table holds (re-filtering writes these)."""
    entry = F.explode(_broker_entries(brokers)).alias("match")
    return decided.select("night", "visit_id", "alert_id", "kafka_partition", "kafka_offset", "kafka_timestamp",
                          entry).select(
        "night", "visit_id", "alert_id", F.col("match.broker").alias("broker"), F.col("match.topic").alias("topic"),
        F.split(F.col("match.filters"), ",").alias("filters"), F.col("match.format").alias("format"),
        "kafka_partition", "kafka_offset", "kafka_timestamp",
        F.from_json("match.watch", WATCH_MATCHES_DDL).alias("watch"))
