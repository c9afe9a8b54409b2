"""Watchlists and watchmaps as versioned Delta tables, one table per list or map.

``<state_dir>/watch/watchlist/<name>`` and ``<state_dir>/watch/watchmap/<name>``.
Every change (an ``add`` or a ``remove``) is one commit that overwrites the
whole table, so a version is self-contained: the files its commit added are
the version, and a night replayed with the version it ran with reads exactly
what it read.  Versions are read from the Delta log (the protocol's JSON
commits), without Spark, so the running stream can look for a new version
before every batch and the workers can read a version's Parquet files directly.
Writing goes through Delta Lake (Spark), which keeps the table's history.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pandas as pd

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.watch.crossmatch import WatchVersion

KINDS = ("watchlist", "watchmap")
LIST_COLUMNS = {"source_id": "string", "source_name": "string", "ra": "double", "dec": "double",
                "radius_arcsec": "double"}
MAP_COLUMNS = {"uniq": "bigint", "probability_density": "double", "credible_level": "double"}


@dataclass(frozen=True)
class StoredVersion:
    """One version of a list or map: its number, files, size and what the ``add`` said about it."""

    kind: str
    name: str
    version: int
    files: tuple[str, ...]
    rows: int
    timestamp_ms: int
    details: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def removed(self) -> bool:
        return bool(self.details.get("removed"))

    def for_workers(self) -> WatchVersion:
        """What a worker needs to load it."""
        return WatchVersion(self.kind, self.name, self.version, self.files)


def watch_dir(cfg: Config, kind: str) -> Path:
    """The folder of every list (``watchlist``) or map (``watchmap``) table."""
    return cfg.state_dir / "watch" / kind


def table_path(cfg: Config, kind: str, name: str) -> Path:
    """The Delta table of one list or map."""
    return watch_dir(cfg, kind) / name


def versions(table: Path) -> list[int]:
    """The versions of a table, oldest first (empty when there is no table)."""
    log = table / "_delta_log"
    if not log.is_dir():
        return []
    return sorted(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())


def read_version(kind: str, table: Path, version: int) -> StoredVersion:
    """One version of a table, from its commit in the Delta log."""
    files, rows, info = [], 0, {}
    commit = table / "_delta_log" / f"{version:020d}.json"
    if not commit.exists():
        raise SkyfilterError(f"{kind} '{table.name}' has no version {version} (its log was cleaned up, or it "
                             f"never had one)")
    for line in commit.read_text().splitlines():
        action = json.loads(line)
        if "add" in action:
            files.append(str(table / unquote(action["add"]["path"])))
            stats = json.loads(action["add"].get("stats") or "{}")
            rows += int(stats.get("numRecords", 0))
        elif "commitInfo" in action:
            info = action["commitInfo"]
    details = json.loads(info.get("userMetadata") or "{}")
    return StoredVersion(kind, table.name, version, tuple(sorted(files)), rows, int(info.get("timestamp", 0)),
                         details)


def latest(cfg: Config, kind: str, name: str) -> StoredVersion | None:
    """The newest version of a list or map, or None if it was never added (a removed one is returned, marked)."""
    table = table_path(cfg, kind, name)
    found = versions(table)
    return read_version(kind, table, found[-1]) if found else None


def names(cfg: Config, kind: str) -> list[str]:
    """Every list (or map) ever added, removed ones included."""
    folder = watch_dir(cfg, kind)
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if folder.is_dir() else []


def unit(kind: str) -> str:
    """What a list's or a map's rows are."""
    return "sources" if kind == "watchlist" else "cells"


def existing(cfg: Config, kind: str, name: str) -> StoredVersion:
    """The newest version of a list or map that exists (not removed); an error naming it otherwise."""
    found = latest(cfg, kind, name)
    if found is None or found.removed:
        raise SkyfilterError(f"no {kind} named '{name}' (see: skyfilter {kind} list)")
    return found


def current(cfg: Config, kind: str) -> dict[str, StoredVersion]:
    """Every list (or map) that exists now, at its newest version, by name."""
    found = {name: latest(cfg, kind, name) for name in names(cfg, kind)}
    return {name: stored for name, stored in found.items() if stored is not None and not stored.removed}


def version_at(cfg: Config, kind: str, name: str, when_ms: int) -> StoredVersion | None:
    """The version of a list or map that was current at ``when_ms`` (ms since the epoch), if any."""
    table = table_path(cfg, kind, name)
    chosen = None
    for number in versions(table):
        stored = read_version(kind, table, number)
        if stored.timestamp_ms > when_ms:
            break
        chosen = stored
    return None if chosen is None or chosen.removed else chosen


def fingerprint(cfg: Config) -> tuple:
    """(kind, name, newest version) of every table: changes when anything is added or removed."""
    stamps = []
    for kind in KINDS:
        for name in names(cfg, kind):
            found = versions(table_path(cfg, kind, name))
            stamps.append((kind, name, found[-1] if found else -1))
    return tuple(stamps)


def store(spark, cfg: Config, kind: str, name: str, rows: pd.DataFrame, details: dict) -> StoredVersion:
    """Write ``rows`` as the new version of a list or map (one commit replacing the whole table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = LIST_COLUMNS if kind == "watchlist" else MAP_COLUMNS
    arrow_types = {"string": pa.string(), "double": pa.float64(), "bigint": pa.int64()}
    schema = pa.schema([(column, arrow_types[spark_type]) for column, spark_type in columns.items()])
    staging = cfg.state_dir / "watch" / ".staging" / f"{uuid.uuid4().hex}.parquet"
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        pq.write_table(pa.Table.from_pandas(rows[list(columns)], schema=schema, preserve_index=False), staging)
        frame = spark.read.schema(", ".join(f"{c} {t}" for c, t in columns.items())).parquet(str(staging))
        _overwrite(frame.coalesce(1), table_path(cfg, kind, name), details)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        staging.unlink(missing_ok=True)
    return latest(cfg, kind, name)


def remove(spark, cfg: Config, kind: str, name: str) -> StoredVersion:
    """Empty a list or map in a commit marked removed: filters can no longer name it, and its versions stay
    for replaying the nights that used them."""
    existing(cfg, kind, name)
    columns = LIST_COLUMNS if kind == "watchlist" else MAP_COLUMNS
    empty = spark.createDataFrame([], ", ".join(f"{c} {t}" for c, t in columns.items()))
    _overwrite(empty, table_path(cfg, kind, name), {"removed": True})
    return latest(cfg, kind, name)


def _overwrite(frame, path: Path, details: dict) -> None:
    (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("userMetadata", json.dumps(details, sort_keys=True)).save(str(path)))
