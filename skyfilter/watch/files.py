"""Reading the files users give as watchlists (sources with a radius) and watchmaps (sky regions).

A watchlist file is a table: CSV, Parquet, or a FITS or VOTable table, with
columns ``id``, ``ra`` and ``dec`` (degrees, ICRS), and optionally ``radius``
(arcsec) and ``name``.  A watchmap file is a MOC (FITS, as written by mocpy or
the IVOA standard), or a HEALPix probability skymap (LIGO/Virgo/KAGRA style:
multi-order with ``UNIQ`` and ``PROBDENSITY``, or flat with ``PROB``), of
which the credible region of a given level is kept.

Every problem is one line naming the file and, for a table, the row.
Nothing here writes anything: a file that fails leaves the stored version as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from skyfilter.core.errors import SkyfilterError

MAX_RADIUS_ARCSEC = 3600.0  # 1 degree
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")  # a SQL identifier: watchlists.<name>.matched
LIST_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".fits": "fits", ".fit": "fits",
                 ".fits.gz": "fits", ".vot": "votable", ".votable": "votable", ".xml": "votable"}
MAP_SUFFIXES = (".fits", ".fit", ".fits.gz", ".moc.fits", ".multiorder.fits")
COLUMN_NAMES = {"id": ("id", "source_id"), "ra": ("ra",), "dec": ("dec",),
                "radius": ("radius", "radius_arcsec"), "name": ("name", "source_name")}


def check_name(name: str, kind: str) -> str:
    """A list or map name usable in filters as ``watchlists.<name>`` (letters, digits, '_')."""
    if not NAME_PATTERN.match(name):
        raise SkyfilterError(f"{kind} name '{name}': use letters, digits and '_', starting with a letter "
                             f"(filters write {kind}s.{name})")
    return name


def check_radius(radius: float, where: str) -> float:
    """A radius in arcsec within (0, 1 degree]."""
    if not np.isfinite(radius) or radius <= 0 or radius > MAX_RADIUS_ARCSEC:
        raise SkyfilterError(f"{where}: radius {radius:g} arcsec must be > 0 and <= {MAX_RADIUS_ARCSEC:g} "
                             f"(1 degree)")
    return float(radius)


def file_format(path: Path, suffixes: dict[str, str]) -> str:
    """The format of a file from its name."""
    name = path.name.lower()
    for suffix in sorted(suffixes, key=len, reverse=True):
        if name.endswith(suffix):
            return suffixes[suffix]
    raise SkyfilterError(f"{path}: unknown file format '{path.suffix or path.name}' (a watchlist is CSV, Parquet, "
                         f"FITS or VOTable: .csv, .parquet, .fits, .vot)")


def read_table(path: Path) -> tuple[pd.DataFrame, int]:
    """The rows of a table file and the number of the first data row as the user counts it (a CSV's header
    is line 1, so its first row is line 2)."""
    if not path.is_file():
        raise SkyfilterError(f"{path}: no such file")
    kind = file_format(path, LIST_SUFFIXES)
    try:
        if kind == "csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False), 2
        if kind == "parquet":
            return pd.read_parquet(path), 1
        from astropy.table import Table

        table = Table.read(path, format="fits" if kind == "fits" else "votable")
        return table.to_pandas(), 1
    except SkyfilterError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader's failure is the file's problem
        raise SkyfilterError(f"{path}: cannot read it as {kind}: {_first_line(exc)}") from None


def read_watchlist(path: str | Path, default_radius: float) -> pd.DataFrame:
    """The sources of a watchlist file: ``source_id``, ``source_name``, ``ra``, ``dec``, ``radius_arcsec``.

    A source without its own radius gets ``default_radius`` (arcsec).  Refused, with the file and row: no
    rows, a missing column, a coordinate missing, not a number or out of range, a duplicate id, a radius
    <= 0 or > 1 degree.
    """
    path = Path(path)
    check_radius(default_radius, f"{path}: default")
    rows, first = read_table(path)
    columns = _columns(rows, path)
    if rows.empty:
        raise SkyfilterError(f"{path}: no sources")
    number = np.arange(len(rows)) + first
    ids = rows[columns["id"]].astype(str).str.strip()
    _refuse(path, number, ids.isin(["", "nan", "None", "<NA>"]).to_numpy() | rows[columns["id"]].isna().to_numpy(),
            "id is missing")
    ra = _numbers(rows, columns["ra"], path, number)
    dec = _numbers(rows, columns["dec"], path, number)
    _refuse(path, number, (ra < 0) | (ra >= 360), "ra {} is not within 0 <= ra < 360", ra)
    _refuse(path, number, (dec < -90) | (dec > 90), "dec {} is not within -90..90", dec)
    if "radius" in columns:
        given = _numbers(rows, columns["radius"], path, number, optional=True)
        radius = np.where(np.isnan(given), default_radius, given)
        _refuse(path, number, (radius <= 0) | (radius > MAX_RADIUS_ARCSEC),
                f"radius {{}} arcsec must be > 0 and <= {MAX_RADIUS_ARCSEC:g} (1 degree)", radius)
    else:
        radius = np.full(len(rows), default_radius)
    repeated = ids.duplicated(keep=False).to_numpy()
    if repeated.any():
        rows_of = number[ids.to_numpy() == ids[repeated].iloc[0]]
        raise SkyfilterError(f"{path} rows {rows_of[0]} and {rows_of[1]}: duplicate id '{ids[repeated].iloc[0]}'"
                             + _more(int(ids[repeated].nunique()) - 1, "duplicate id"))
    names = rows[columns["name"]].astype(str).where(rows[columns["name"]].notna(), None) \
        if "name" in columns else pd.Series([None] * len(rows), dtype=object)
    return pd.DataFrame({"source_id": ids.to_numpy(), "source_name": names.to_numpy(dtype=object),
                         "ra": ra, "dec": dec, "radius_arcsec": radius.astype(float)})


def _columns(rows: pd.DataFrame, path: Path) -> dict[str, str]:
    lower = {str(c).lower(): str(c) for c in rows.columns}
    found = {}
    for key, names in COLUMN_NAMES.items():
        match = next((lower[n] for n in names if n in lower), None)
        if match is not None:
            found[key] = match
        elif key in ("id", "ra", "dec"):
            raise SkyfilterError(f"{path}: no '{key}' column (it has: {', '.join(map(str, rows.columns)) or 'none'})")
    return found


def _numbers(rows: pd.DataFrame, column: str, path: Path, number: np.ndarray, optional: bool = False
             ) -> np.ndarray:
    text = rows[column]
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    blank = text.isna().to_numpy() | text.astype(str).str.strip().isin(["", "nan", "NaN", "None", "<NA>"]).to_numpy()
    if not optional:
        _refuse(path, number, blank, f"{column} is missing")
    bad = np.isnan(values) & ~blank | np.isinf(values)
    _refuse(path, number, bad, f"{column} {{}} is not a number", text.to_numpy())
    return values


def _refuse(path: Path, number: np.ndarray, bad: np.ndarray, message: str, values=None) -> None:
    bad = np.asarray(bad, dtype=bool)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        shown = message.format(repr(values[first]) if isinstance(values[first], str) else f"{values[first]:g}") \
            if values is not None else message
        raise SkyfilterError(f"{path} row {number[first]}: {shown}" + _more(int(bad.sum()) - 1, "row"))


def _more(count: int, what: str) -> str:
    return f" (and {count} more {what}{'s' if count > 1 else ''} like it)" if count > 0 else ""


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------ watchmaps
@dataclass(frozen=True)
class SkyMap:
    """A watchmap as stored: HEALPix cells (NUNIQ numbering) with, for a skymap, each cell's probability
    density (per square degree) and credible level (the probability of the smallest region that holds it)."""

    uniq: np.ndarray
    probability_density: np.ndarray  # NaN for a plain MOC
    credible_level: np.ndarray  # NaN for a plain MOC
    kind: str  # "moc" or "skymap"

    def frame(self) -> pd.DataFrame:
        """The cells as the table stores them."""
        return pd.DataFrame({"uniq": self.uniq.astype(np.int64), "probability_density": self.probability_density,
                             "credible_level": self.credible_level})


def read_watchmap(path: str | Path, level: float) -> SkyMap:
    """The cells of a MOC file, or of the ``level`` credible region of a HEALPix skymap.

    A skymap keeps the cells, highest probability density first, whose running probability stays within
    ``level`` (mocpy's ``from_valued_healpix_cells`` rule, ``strict``): 0.9 keeps the 90% credible region.
    """
    path = Path(path)
    if not path.is_file():
        raise SkyfilterError(f"{path}: no such file")
    if not 0 < level <= 1:
        raise SkyfilterError(f"{path}: credible level {level:g} must be > 0 and <= 1 (0.9 keeps the 90% region)")
    if not path.name.lower().endswith(MAP_SUFFIXES):
        raise SkyfilterError(f"{path}: unknown file format '{path.suffix or path.name}' (a watchmap is a MOC or a "
                             f"HEALPix skymap in FITS: .fits)")
    try:
        from astropy.io import fits

        with fits.open(path) as hdus:
            table_hdu = next((h for h in hdus[1:] if isinstance(h, fits.BinTableHDU)), None)
            if table_hdu is None:
                raise ValueError("no binary table")
            names = {n.upper() for n in table_hdu.columns.names}
            header = table_hdu.header
            if "PROBDENSITY" in names:
                uniq = np.asarray(table_hdu.data["UNIQ"], dtype=np.int64)
                density = np.asarray(table_hdu.data["PROBDENSITY"], dtype=float)  # per steradian
                return _credible_region(uniq, density * (np.pi / 180) ** 2, level)
            if "PROB" in names:
                return _flat_skymap(np.asarray(table_hdu.data["PROB"], dtype=float).ravel(), header, level)
        from mocpy import MOC

        moc = MOC.load(path, format="fits")
        uniq = np.asarray(moc.uniq_hpx, dtype=np.int64)
    except SkyfilterError as exc:
        raise SkyfilterError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the readers say, it is this file's problem
        raise SkyfilterError(f"{path}: not a MOC or HEALPix skymap: {_first_line(exc)}") from None
    if uniq.size == 0:
        raise SkyfilterError(f"{path}: the MOC is empty")
    nothing = np.full(uniq.size, np.nan)
    return SkyMap(np.sort(uniq), nothing, nothing, "moc")


def _flat_skymap(probability: np.ndarray, header, level: float) -> SkyMap:
    from astropy_healpix import npix_to_nside
    from astropy_healpix.core import ring_to_nested

    nside = npix_to_nside(probability.size)
    pixels = np.arange(probability.size)
    if str(header.get("ORDERING", "RING")).upper().startswith("RING"):
        pixels = ring_to_nested(pixels, nside)
    uniq = 4 * nside * nside + pixels.astype(np.int64)
    area_deg2 = 41252.96124941928 / probability.size
    return _credible_region(uniq, probability / area_deg2, level)


def cell_area_deg2(uniq: np.ndarray) -> np.ndarray:
    """The area of NUNIQ-numbered HEALPix cells, square degrees."""
    from astropy_healpix import nside_to_pixel_area

    depth = (np.floor(np.log2(uniq // 4) / 2)).astype(int)
    return np.asarray(nside_to_pixel_area(2 ** depth).to_value("deg2"))


def _credible_region(uniq: np.ndarray, density_deg2: np.ndarray, level: float) -> SkyMap:
    if uniq.size == 0 or not np.isfinite(density_deg2).all() or (density_deg2 < 0).any():
        raise ValueError("the skymap's probabilities are empty, negative or not numbers")
    probability = density_deg2 * cell_area_deg2(uniq)
    total = probability.sum()
    if total <= 0:
        raise ValueError("the skymap's probabilities sum to 0")
    order = np.argsort(-density_deg2, kind="stable")
    running = np.cumsum(probability[order]) / total
    keep = order[running <= level + 1e-12]
    levels = np.empty(uniq.size)
    levels[order] = running
    if keep.size == 0:
        raise SkyfilterError(f"the {level:g} credible region holds no whole cell (its densest cell alone holds "
                             f"{running[0]:.3g})")
    chosen = keep[np.argsort(uniq[keep])]
    return SkyMap(uniq[chosen], density_deg2[chosen], levels[chosen], "skymap")
