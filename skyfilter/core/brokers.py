"""Downstream brokers (``conf/brokers.yaml``): each one's filters, output topic, format and per-visit cap."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from skyfilter.core.errors import SkyfilterError

FORMATS = ("full", "nocutouts", "lite")
# How messages are laid out on the wire, for the clients community brokers run:
#   confluent - Confluent wire format (magic byte, schema id, Avro body): confluent-kafka's AvroDeserializer
#   fink      - Fink's layout: the Avro schema (JSON) as the message key, the Avro body alone as the value
#               (fink-client's AlertConsumer)
#   json      - one JSON object per message (Lasair's Kafka consumers); lite and nocutouts only
ENCODINGS = ("confluent", "fink", "json")
DEFAULT_MAX_ALERTS_PER_VISIT = 20  # Rubin's numBrokerAlerts: "100 users x 20 full alerts per visit"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")


# The settings a broker's entry in the brokers file may have; each is a field of BrokerSpec below.
SETTINGS = ("filters", "watchlists", "watchmaps", "topic", "format", "encoding", "max_alerts_per_visit")


@dataclass(frozen=True)
class BrokerSpec:
    """One downstream broker's subscription; a value (equal settings, equal brokers), never changed once made."""

    name: str
    filters: tuple[str, ...]  # the broker's filters; a watchlist or watchmap subscription is 'watchlist:NAME'
    topic: str
    format: str = "full"
    line: int = field(default=1, compare=False)  # where it is in the brokers file (not part of its value)
    max_alerts_per_visit: int | None = DEFAULT_MAX_ALERTS_PER_VISIT  # None: no cap
    enabled_filters: tuple[str, ...] = ()  # its filters that work (set when a stream plan is made)
    encoding: str = "confluent"
    watch_matches: str = ""  # SQL of the alert's matches among the lists and maps its filters use ("" if none)

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", tuple(self.filters))
        object.__setattr__(self, "enabled_filters", tuple(self.enabled_filters))

    @property
    def delivery(self) -> tuple:
        """What decides what and how the broker is sent: equal for two versions of it, nothing to restart."""
        return self.name, self.topic, self.format, self.encoding, self.max_alerts_per_visit, self.enabled_filters


class _LineLoader(yaml.SafeLoader):
    """A YAML loader that remembers the line of every mapping."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def default_topic(broker: str) -> str:
    """The output topic of a broker that does not name one."""
    return f"filtered.{broker}"


def load_brokers(path: str | Path) -> list[BrokerSpec]:
    """Read a brokers file; a malformed entry is a one-line error with file and line.

    A top-level ``max_alerts_per_visit`` sets the cap of every broker that does
    not set its own (default 20); ``null`` means no cap.
    """
    path = Path(path)
    if not path.exists():
        raise SkyfilterError(f"brokers file not found: {path}")
    try:
        data = yaml.load(path.read_text(), Loader=_LineLoader) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SkyfilterError(f"{path}:{mark.line + 1 if mark else 1}: invalid YAML: "
                             f"{getattr(exc, 'problem', exc)}") from None
    entries = data.get("brokers")
    if not isinstance(entries, dict) or len(entries) <= 1:
        raise SkyfilterError(f"{path}:1: expected a 'brokers:' mapping with at least one broker")
    default_cap = _cap(data.get("max_alerts_per_visit", DEFAULT_MAX_ALERTS_PER_VISIT), f"{path}:1")
    brokers, topics = [], {}
    for name, entry in entries.items():
        if name == "__line__":
            continue
        line = entry.get("__line__", 1) if isinstance(entry, dict) else entries["__line__"]
        where = f"{path}:{line}: broker '{name}'"
        if not isinstance(entry, dict):
            raise SkyfilterError(f"{where}: expected a mapping with 'filters:'")
        if not NAME_PATTERN.match(str(name)):
            raise SkyfilterError(f"{where}: names are letters, digits, '.', '_' and '-'")
        filters = _names(entry, "filters", where)
        for kind in ("watchlist", "watchmap"):  # a subscription to a list or map is the filter 'kind:name'
            filters += [f"{kind}:{name}" for name in _names(entry, f"{kind}s", where)]
        if not filters:
            raise SkyfilterError(f"{where}: 'filters' (or 'watchlists', 'watchmaps') must name at least one")
        unknown = set(entry) - {*SETTINGS, "__line__"}
        if unknown:
            raise SkyfilterError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
        fmt = str(entry.get("format", "full"))
        if fmt not in FORMATS:
            raise SkyfilterError(f"{where}: format '{fmt}' is not one of {', '.join(FORMATS)}")
        encoding = str(entry.get("encoding", "confluent"))
        if encoding not in ENCODINGS:
            raise SkyfilterError(f"{where}: encoding '{encoding}' is not one of {', '.join(ENCODINGS)}")
        if encoding == "json" and fmt == "full":
            raise SkyfilterError(f"{where}: encoding json needs format lite or nocutouts (full sends the alert's "
                                 f"own Avro bytes)")
        topic = str(entry.get("topic") or default_topic(str(name)))
        if topic in topics:
            raise SkyfilterError(f"{where}: topic '{topic}' is already used by broker '{topics[topic]}'")
        topics[topic] = name
        cap = _cap(entry["max_alerts_per_visit"], where) if "max_alerts_per_visit" in entry else default_cap
        brokers.append(BrokerSpec(str(name), list(dict.fromkeys(filters)), topic, fmt, line, cap,
                                  encoding=encoding))
    return brokers


def _names(entry: dict, key: str, where: str) -> list[str]:
    names = entry.get(key) or []
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise SkyfilterError(f"{where}: '{key}' must be a list of names")
    return names


def _cap(value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SkyfilterError(f"{where}: max_alerts_per_visit must be a whole number >= 0, or null for no cap")
    return value
