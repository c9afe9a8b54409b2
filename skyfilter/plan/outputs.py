"""What each broker's topic receives: the topic itself and, unless ``full``, the schema of its messages.

* ``full``: the input message bytes unchanged (cutouts included);
* ``nocutouts``: the alert without its cutout fields, one reduced schema
  registered for every such broker's topic;
* ``lite``: a small flat record of the columns the broker's SQL filters
  select (``SELECT <columns> FROM alerts WHERE ...``); the union over the
  broker's filters, in filter order, or just ``alert_id`` when none selects
  any, then ``watch`` when its filters use watchlists or watchmaps (the
  alert's matches among them), then ``matched_filters``: the names of the
  broker's filters the alert matched.  Its Avro schema is derived from the columns' Spark types.

Every broker topic's schema is registered under its subject ``<topic>-value``
in the output registry (``full`` too: the input's writer schemas, under their ids),
so a standard Confluent consumer decodes any of them.  A broker's ``encoding``
picks the wire layout for the clients it runs (``confluent`` by default, ``fink``
for fink-client, ``json`` for Lasair-style consumers; a ``json`` topic registers
no schema).
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.core.alert_columns import detect
from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.kafka.topics import ensure_topics
from skyfilter.plan.outgoing import MATCHED_FIELD, Encoding, filter_names
from skyfilter.registry.client import open_registry, subject_for
from skyfilter.schemas.avro import schema_text, without_fields
from skyfilter.spark.internals import avro_schema_of
from skyfilter.watch.columns import WATCH_FIELD

LITE_NAMESPACE = "skyfilter.lite"


def lite_columns(broker: BrokerSpec, filters: list[FilterSpec]) -> tuple[tuple[str, str], ...]:
    """The (name, expression) pairs of a ``lite`` broker's record."""
    by_name = {spec.name: spec for spec in filters}
    columns: dict[str, str] = {}
    for filter_name in broker.enabled_filters:
        for name, expression in by_name[filter_name].selects:
            if columns.setdefault(name, expression) != expression:
                raise SkyfilterError(f"broker '{broker.name}': filters select two different columns named '{name}' "
                                     f"({columns[name]} and {expression}); rename one with AS")
    for reserved, purpose in ((MATCHED_FIELD, "list the filters they matched"),
                              (WATCH_FIELD, "carry their watchlist and watchmap matches")):
        if reserved in columns and (reserved != WATCH_FIELD or broker.watch_matches):
            raise SkyfilterError(f"broker '{broker.name}': a filter selects a column named '{reserved}', the "
                                 f"field where lite records {purpose}; rename it with AS")
    chosen = tuple(columns.items()) or (("alert_id", "alert_id"),)
    return chosen + (((WATCH_FIELD, broker.watch_matches),) if broker.watch_matches else ())


def lite_schema(template: DataFrame, broker: BrokerSpec, columns: tuple[tuple[str, str], ...]) -> dict:
    """The Avro record of a ``lite`` broker, from the Spark types of its columns (what ``to_avro`` writes)."""
    fields = [F.expr(e).alias(n) for n, e in columns] + [filter_names(F.lit(None)).alias(MATCHED_FIELD)]
    struct = template.select(F.struct(*fields).alias("lite")).schema[0].dataType
    record = re.sub(r"[^A-Za-z0-9_]", "_", broker.name)
    definition = avro_schema_of(template.sparkSession, struct.json(), record, LITE_NAMESPACE)
    definition["doc"] = f"skyfilter lite alerts of broker {broker.name}"
    return definition


def prepare_outputs(cfg: Config, template: DataFrame, inputs: InputSchemas, cutouts: list[str],
                    brokers: list[BrokerSpec], filters: list[FilterSpec]) -> dict[str, Encoding]:
    """Create the broker topics and register each one's schema under ``<topic>-value`` in the output registry.

    A ``full`` topic resends the input messages, so its subject holds the input's
    writer schemas under their own ids; ``nocutouts`` and ``lite`` records are
    built from the reader schema, the same whatever each alert's writer schema.
    Returns the encoding of every non-``full`` broker.
    """
    encodings: dict[str, Encoding] = {}
    registry = open_registry(cfg, output=True) if brokers else None
    reduced = without_fields(inputs.reader, cutouts)
    alert_id = detect(inputs.reader, cfg).alert_id  # the alert's own id, of its own type (the column is a string)
    for broker in brokers:
        if broker.format == "full":
            register_writers(registry, broker.topic, inputs.readable)
            if broker.encoding != "confluent":
                encodings[broker.name] = Encoding("", 0, (), wire=broker.encoding, original=True)
            continue
        if broker.format == "nocutouts":
            columns = tuple((f["name"], f"`{f['name']}`") for f in reduced["fields"])
            schema = reduced
        elif broker.format == "lite":
            columns = tuple((name, alert_id if expression == "alert_id" else expression)
                            for name, expression in lite_columns(broker, filters))
            schema = lite_schema(template, broker, columns)
        output_id = 0 if broker.encoding == "json" else registry.register(subject_for(broker.topic), schema)
        encodings[broker.name] = Encoding(schema_text(schema), output_id, columns, broker.format == "lite",
                                          wire=broker.encoding)
    ensure_topics(cfg, {b.topic: cfg.topics.broker_partitions for b in brokers})
    return encodings


def register_writers(registry, topic: str, writers: dict[int, str], same_alerts: bool = False) -> None:
    """Register the input's writer schemas (oldest first), under their own ids, for a topic that carries the
    input's bytes (``same_alerts``: an input topic, see ``SchemaRegistry.register``)."""
    for schema_id, text in writers.items():
        registry.register(subject_for(topic), text, same_alerts=same_alerts, schema_id=schema_id)
