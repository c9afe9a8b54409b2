"""``skyfilter watchlist`` and ``skyfilter watchmap``: add, list, show and remove the lists and maps filters use.

A file is read and checked completely before anything is written: a bad
file is one line naming it (and the row) and the stored version stays as it
was, so a running stream keeps reading it.  A good one becomes the list's or
map's next Delta version, which a running stream picks up before its next
batch (``stream.hot_reload``).
"""

from __future__ import annotations

import argparse
import logging
import time
from datetime import UTC, datetime

import numpy as np

from skyfilter.core.errors import SkyfilterError
from skyfilter.local.arguments import config_from_args
from skyfilter.watch.crossmatch import read_index
from skyfilter.watch.files import cell_area_deg2, check_name, read_watchlist, read_watchmap
from skyfilter.watch.store import current, existing, latest, read_version, remove, store, table_path, unit

logger = logging.getLogger(__name__)

DEFAULT_RADIUS_ARCSEC = 2.0
DEFAULT_LEVEL = 0.9
ABOUT = {
    "watchlist": ("sources to follow: every alert within a source's radius matches it",
                  "FILE is CSV, Parquet, or a FITS or VOTable table with columns id, ra, dec (degrees) and "
                  "optionally radius (arcsec) and name.  Filters use it as watchlists.NAME.matched, "
                  ".source_id, .source_name, .separation_arcsec; brokers.yaml can subscribe a broker with "
                  "'watchlists: [NAME]'."),
    "watchmap": ("sky regions to follow: a MOC, or the credible region of a HEALPix skymap",
                 "FILE is a MOC (FITS) or a HEALPix probability skymap (FITS, multi-order or flat, as LIGO/Virgo/"
                 "KAGRA publish them), of which the --level credible region is kept.  Filters use it as "
                 "watchmaps.NAME.inside, .credible_level, .probability_density; brokers.yaml can subscribe a broker "
                 "with 'watchmaps: [NAME]'."),
}


def run(args: argparse.Namespace) -> int:
    """Run one ``watchlist``/``watchmap`` action; errors raise :class:`SkyfilterError`."""
    cfg = config_from_args(args)
    kind = args.command
    if args.action == "list":
        return _list(cfg, kind)
    if args.action == "show":
        return _show(cfg, kind, args.name, args.version, args.limit)
    from skyfilter.spark.session import get_spark

    name = check_name(args.name, kind)
    began = time.time()
    if args.action == "remove":
        existing(cfg, kind, name)  # before Spark starts
        stored = remove(get_spark(f"skyfilter-{kind}"), cfg, kind, name)
        logger.info(f"{kind} {name} removed (version {stored.version}; earlier versions stay for replays) "
                    f"in {time.time() - began:.1f} s")
        return 0
    logger.info(f"reading {args.file} ...")
    if kind == "watchlist":
        rows = read_watchlist(args.file, args.radius)
        details = {"file": str(args.file), "default_radius_arcsec": args.radius,
                   "max_radius_arcsec": float(rows["radius_arcsec"].max())}
        size = f"{len(rows):,} sources (radius {rows['radius_arcsec'].min():g}-{rows['radius_arcsec'].max():g} arcsec)"
    else:
        sky = read_watchmap(args.file, args.level)
        rows = sky.frame()
        area = float(cell_area_deg2(sky.uniq).sum())
        details = {"file": str(args.file), "map": sky.kind, "level": args.level if sky.kind == "skymap" else None,
                   "area_deg2": area}
        size = f"{len(rows):,} cells, {area:,.1f} sq. deg." + (f" ({args.level:g} credible region)"
                                                               if sky.kind == "skymap" else " (MOC)")
    logger.info(f"checked: {size}; writing {table_path(cfg, kind, name)} ...")
    stored = store(get_spark(f"skyfilter-{kind}"), cfg, kind, name, rows, details)
    logger.info(f"{kind} {name}: version {stored.version}, {size}, from {args.file} in {time.time() - began:.1f} s")
    return 0


def _when(stored) -> str:
    return datetime.fromtimestamp(stored.timestamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _list(cfg, kind: str) -> int:
    found = current(cfg, kind)
    for name, stored in found.items():
        logger.info(f"{name}  version {stored.version}  {stored.rows:,} {unit(kind)}  "
                    f"from {stored.details.get('file', '?')}  added {_when(stored)}")
    logger.info(f"{len(found)} {kind}(s) in {cfg.state_dir / 'watch' / kind}")
    return 0


def _show(cfg, kind: str, name: str, version: int | None, limit: int) -> int:
    newest = latest(cfg, kind, name)
    if newest is None:
        raise SkyfilterError(f"no {kind} named '{name}' (see: skyfilter {kind} list)")
    table = table_path(cfg, kind, name)
    for number in range(newest.version + 1):
        try:
            stored = read_version(kind, table, number)
        except SkyfilterError:
            continue
        what = "removed" if stored.removed else f"{stored.rows:,} rows from {stored.details.get('file', '?')}"
        logger.info(f"version {number}: {what}, {_when(stored)}")
    chosen = read_version(kind, table, newest.version if version is None else version)
    if chosen.removed or not chosen.rows:
        logger.info(f"{kind} {name} version {chosen.version} holds nothing")
        return 0
    index = read_index(chosen.for_workers())
    shown = min(limit, len(index))
    if kind == "watchlist":
        for i in range(shown):
            source_name = index.source_name[i].as_py()
            ra, dec = np.degrees(index.ra[i]), np.degrees(index.dec[i])
            logger.info(f"  {index.source_id[i].as_py()}{f' ({source_name})' if source_name else ''}  ra {ra:.6f}  "
                        f"dec {dec:+.6f}  radius {index.radius[i]:g} arcsec")
    else:
        for i in range(shown):
            depth = int(np.floor(np.log2(index.uniq[i] // 4) / 2))
            level = "" if np.isnan(index.level[i]) else f"  credible level {index.level[i]:.3f}  " \
                                                         f"density {index.density[i]:.3g}/sq. deg."
            logger.info(f"  cell {index.uniq[i]} (depth {depth}){level}")
    logger.info(f"{kind} {name} version {chosen.version}: {chosen.rows:,} rows, {shown} shown")
    return 0
