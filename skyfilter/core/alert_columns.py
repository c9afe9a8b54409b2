"""Which fields of an alert schema are its id, its time and its visit.

Known schema families (Rubin, ZTF) are recognised by their fields; any other
schema names them in ``stream.alert_columns`` of the config.  The night of an
alert is the UTC date of (observation time - ``night_offset_hours``): with 12 h
this is Rubin's ``dayObs``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError

MJD_UNIX_EPOCH = 40587.0


@dataclass(frozen=True)
class AlertColumns:
    """SQL expressions over a decoded alert, plus the id's field path for Python."""

    family: str
    alert_id: str
    time_mjd: str
    visit_id: str
    ra: str | None = None  # the position (degrees), for watchlists and watchmaps; None: unknown
    dec: str | None = None


# (family, alert id field, time in MJD, visit id) - the first whose fields all exist wins.  Rubin's first
# row is schema 8.0 onwards (lsst-alert-packet's versions 3.0-11.1 are all recognised).
KNOWN_FAMILIES = [
    ("rubin", "diaSourceId", "diaSource.midpointMjdTai", "diaSource.visit",
     ["diaSourceId", "diaSource.midpointMjdTai", "diaSource.visit"]),
    ("rubin-v7", "alertId", "diaSource.midpointMjdTai", "diaSource.visit",  # 7.0-7.4
     ["alertId", "diaSource.midpointMjdTai", "diaSource.visit"]),
    ("rubin-v5", "alertId", "diaSource.midpointMjdTai", "diaSource.ccdVisitId",  # 5.0-6.1
     ["alertId", "diaSource.midpointMjdTai", "diaSource.ccdVisitId"]),
    ("rubin-v3", "alertId", "diaSource.midPointTai", "diaSource.ccdVisitId",  # 3.0-4.0
     ["alertId", "diaSource.midPointTai", "diaSource.ccdVisitId"]),
    # ZTF has no visit id in the alert: every alert of an exposure shares its start time.
    ("ztf", "candid", "candidate.jd - 2400000.5",
     "CAST(round((candidate.jd - 2400000.5) * 86400) AS BIGINT)", ["candid", "candidate.jd"]),
]


# The position's fields, the first present wins (Rubin 3.0-5.x called the declination `decl`).
POSITION_FIELDS = {"ra": ("diaSource.ra", "candidate.ra"), "dec": ("diaSource.dec", "diaSource.decl", "candidate.dec")}


def field_paths(schema: dict, prefix: str = "") -> set[str]:
    """Every dotted path to a field of a record schema (through nullable unions)."""
    paths = set()
    for f in schema.get("fields", []):
        path = prefix + f["name"]
        paths.add(path)
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        for t in types:
            if isinstance(t, dict) and t.get("type") == "record":
                paths |= field_paths(t, path + ".")
    return paths


def detect(schema: dict, cfg: Config | None = None) -> AlertColumns:
    """The id/time/visit expressions for a schema: from the config, else its known family."""
    wanted = {k: "auto" for k in ("alert_id", "time_mjd", "visit_id")}
    if cfg is not None:
        wanted.update({k: str(v) for k, v in dataclasses.asdict(cfg.stream.alert_columns).items()})
    paths = field_paths(schema)
    family = next((f for f in KNOWN_FAMILIES if all(p in paths for p in f[4])), None)
    chosen = {}
    for position, key in enumerate(("alert_id", "time_mjd", "visit_id"), start=1):
        if wanted[key] != "auto":
            chosen[key] = wanted[key]
        elif family is not None:
            chosen[key] = family[position]
        else:
            raise SkyfilterError(
                f"schema '{schema.get('name')}' is not a known alert family (Rubin, ZTF): "
                f"set stream.alert_columns.{key} in the config")
    if chosen["alert_id"] not in paths:
        raise SkyfilterError(f"stream.alert_columns.alert_id '{chosen['alert_id']}' is not a field "
                             f"of schema '{schema.get('name')}'")
    chosen["ra"], chosen["dec"] = position_fields(paths, cfg)
    return AlertColumns(family[0] if family else "custom", **chosen)


def position_fields(paths: set[str], cfg: Config | None = None) -> tuple[str | None, str | None]:
    """The (ra, dec) expressions of alerts with these field paths: from ``stream.alert_columns``, else the first
    known field present (None: unknown)."""
    found = []
    for key, candidates in POSITION_FIELDS.items():
        wanted = str(getattr(cfg.stream.alert_columns, key)) if cfg is not None else "auto"
        found.append(wanted if wanted != "auto" else next((p for p in candidates if p in paths), None))
    return found[0], found[1]


def alert_id_of(record: dict, columns: AlertColumns):
    """The alert id of a decoded record (the id is always a plain field path)."""
    value = record
    for part in columns.alert_id.split("."):
        value = value[part]
    return value


def current_night(offset_hours: float = 12.0) -> str:
    """Tonight's night label: the UTC date of (now - offset), Rubin's dayObs."""
    return (dt.datetime.now(dt.UTC) - dt.timedelta(hours=offset_hours)).date().isoformat()
