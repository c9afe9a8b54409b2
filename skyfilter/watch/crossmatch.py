"""Alert positions against watchlists and watchmaps, a batch at a time.

Runs where the alerts are: in Spark's Python workers (micro-batches, a pandas
UDF) and in the stream's filter workers (Real-time Mode).  Each worker loads a
list or map version once, from the Parquet files of its Delta table version,
and keeps it while that version is in use.

* A watchlist is a KD-tree (scipy) of its sources' unit vectors (ERFA's
  ``s2c``), so RA wrap-around and the poles need no special
  case: each alert asks it for the sources within the chord of the list's
  largest radius (a ball query per alert: 150 times faster than astropy's
  tree-against-tree ``search_around_sky`` on 10,000,000 sources), astropy's
  ``angular_separation`` gives each candidate's separation, and a source
  matches when that is within its own radius (inclusive, to within
  :data:`TOLERANCE_ARCSEC`).  Plain arrays and ERFA's ``s2c``, not
  ``SkyCoord``: a Real-time request carries one alert, where ``SkyCoord``'s
  units cost 0.7 ms a call.  The nearest
  matching source is reported (ties: the source listed first).
* A watchmap's cells are HEALPix cells of any depth (NUNIQ numbering): the
  alert's cell at the map's deepest depth comes from astropy-healpix, its
  parents at the other depths by NESTED numbering, and the map holds the
  alert when one of those cells is in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOLERANCE_ARCSEC = 1e-6  # a source exactly at its radius matches, whatever the rounding of the separation

LIST_OUTPUTS = (("matched", "bool"), ("source_id", "str"), ("source_name", "str"), ("separation_arcsec", "float"))
MAP_OUTPUTS = (("inside", "bool"), ("credible_level", "float"), ("probability_density", "float"))


@dataclass(frozen=True)
class WatchVersion:
    """One version of a list or map as a worker loads it: what it is, and the Parquet files holding it."""

    kind: str  # "watchlist" or "watchmap"
    name: str
    version: int
    files: tuple[str, ...]

    @property
    def outputs(self) -> tuple[tuple[str, str], ...]:
        return LIST_OUTPUTS if self.kind == "watchlist" else MAP_OUTPUTS


def output_name(position: int, field: str) -> str:
    """The flat output column of a list or map (by its position in the set) and one of its fields."""
    return f"w{position}_{field}"


class ListIndex:
    """A watchlist's sources, searchable by position."""

    def __init__(self, source_id, source_name, ra, dec, radius_arcsec):  # degrees, arcsec
        from astropy.coordinates import Angle
        from scipy.spatial import KDTree

        self.source_id = strings(source_id)  # Arrow strings: a tenth of the memory of Python ones
        self.source_name = strings(source_name)
        self.radius = np.asarray(radius_arcsec, dtype=float)
        self.ra, self.dec = np.radians(np.asarray(ra, dtype=float)), np.radians(np.asarray(dec, dtype=float))
        search = Angle((float(self.radius.max()) if self.radius.size else 0.0) + TOLERANCE_ARCSEC, "arcsec")
        self.chord = float(2 * np.sin(0.5 * search.radian))  # the straight-line distance of that angle
        self.tree = KDTree(unit_vectors(self.ra, self.dec), balanced_tree=False) if self.radius.size else None

    def __len__(self) -> int:
        return self.radius.size

    def match(self, ra: np.ndarray, dec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each position (degrees), the index of the nearest source within its radius (-1: none) and the
        separation (arcsec; NaN when none).  Positions that are not finite match nothing."""
        from astropy.coordinates import angular_separation

        ra, dec = np.asarray(ra, dtype=float), np.asarray(dec, dtype=float)
        nearest, separation = np.full(ra.size, -1), np.full(ra.size, np.nan)
        usable = np.flatnonzero(np.isfinite(ra) & np.isfinite(dec) & (np.abs(dec) <= 90))
        if usable.size == 0 or self.tree is None:
            return nearest, separation
        alert_ra, alert_dec = np.radians(ra[usable]), np.radians(dec[usable])
        candidates = self.tree.query_ball_point(unit_vectors(alert_ra, alert_dec), self.chord)
        alert = np.repeat(np.arange(usable.size), [len(found) for found in candidates])
        source = np.fromiter((i for found in candidates for i in found), dtype=np.int64, count=alert.size)
        if alert.size == 0:
            return nearest, separation
        arcsec = np.degrees(angular_separation(alert_ra[alert], alert_dec[alert], self.ra[source],
                                               self.dec[source])) * 3600
        within = arcsec <= self.radius[source] + TOLERANCE_ARCSEC
        alert, source, arcsec = alert[within], source[within], arcsec[within]
        order = np.lexsort((source, arcsec, alert))  # per alert: nearest first, then the earlier source
        alert, source, arcsec = alert[order], source[order], arcsec[order]
        first = np.ones(alert.size, dtype=bool)
        first[1:] = alert[1:] != alert[:-1]
        nearest[usable[alert[first]]] = source[first]
        separation[usable[alert[first]]] = arcsec[first]
        return nearest, separation

    def outputs(self, ra: np.ndarray, dec: np.ndarray) -> dict[str, list]:
        """The list's output fields (:data:`LIST_OUTPUTS`) for these positions."""
        import pyarrow as pa

        nearest, separation = self.match(ra, dec)
        found = nearest >= 0
        picked = pa.array(nearest[found])
        ids, names = [None] * nearest.size, [None] * nearest.size
        for row, source_id, name in zip(np.flatnonzero(found), self.source_id.take(picked).to_pylist(),
                                        self.source_name.take(picked).to_pylist(), strict=True):
            ids[row], names[row] = source_id, name
        return {"matched": found.tolist(), "source_id": ids, "source_name": names,
                "separation_arcsec": [None if np.isnan(s) else float(s) for s in separation]}


def strings(values):
    """Values as one Arrow string array (a table's column, a list, a numpy array; None stays null)."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values if isinstance(values, pa.Array) else pa.array(list(values), type=pa.string())


def unit_vectors(ra: np.ndarray, dec: np.ndarray) -> np.ndarray:
    """The (n, 3) Cartesian unit vectors of positions in radians (ERFA's ``s2c``, as astropy uses)."""
    import erfa

    return np.ascontiguousarray(erfa.s2c(ra, dec))


class MapIndex:
    """A watchmap's cells, searchable by position."""

    def __init__(self, uniq, probability_density, credible_level):
        order = np.argsort(np.asarray(uniq, dtype=np.int64))
        self.uniq = np.asarray(uniq, dtype=np.int64)[order]
        self.density = np.asarray(probability_density, dtype=float)[order]
        self.level = np.asarray(credible_level, dtype=float)[order]
        self.depths = sorted({int(d) for d in np.floor(np.log2(self.uniq // 4) / 2)}) if self.uniq.size else []

    def __len__(self) -> int:
        return self.uniq.size

    def cells(self, ra: np.ndarray, dec: np.ndarray) -> np.ndarray:
        """For each position, the index of the map's cell holding it (-1: outside the map)."""
        import astropy.units as u
        from astropy_healpix import lonlat_to_healpix

        ra, dec = np.asarray(ra, dtype=float), np.asarray(dec, dtype=float)
        found = np.full(ra.size, -1)
        usable = np.flatnonzero(np.isfinite(ra) & np.isfinite(dec) & (np.abs(dec) <= 90))
        if usable.size == 0 or not self.depths:
            return found
        deepest = self.depths[-1]  # a NESTED cell's parent is its number shifted by two bits a depth
        finest = np.asarray(lonlat_to_healpix(ra[usable] * u.deg, dec[usable] * u.deg, 2 ** deepest, order="nested"),
                            dtype=np.int64)
        for depth in self.depths:
            uniq = 4 * 4 ** depth + (finest >> (2 * (deepest - depth)))
            at = np.minimum(np.searchsorted(self.uniq, uniq), self.uniq.size - 1)
            hit = self.uniq[at] == uniq
            found[usable[hit]] = at[hit]
        return found

    def outputs(self, ra: np.ndarray, dec: np.ndarray) -> dict[str, list]:
        """The map's output fields (:data:`MAP_OUTPUTS`) for these positions."""
        cell = self.cells(ra, dec)
        inside = cell >= 0

        def value(array: np.ndarray) -> list:
            return [None if not hit or np.isnan(array[c]) else float(array[c]) for hit, c in zip(inside, cell,
                                                                                                  strict=True)]

        return {"inside": inside.tolist(), "credible_level": value(self.level),
                "probability_density": value(self.density)}


_LOADED: dict[tuple[str, str], tuple[WatchVersion, ListIndex | MapIndex]] = {}


def loaded(version: WatchVersion) -> ListIndex | MapIndex:
    """The index of a list or map version, read once per process (a newer version of it replaces the older)."""
    key = (version.kind, version.name)
    held = _LOADED.get(key)
    if held is None or held[0] != version:
        _LOADED.pop(key, None)  # free the old version before reading the new one
        _LOADED[key] = version, read_index(version)
    return _LOADED[key][1]


def read_index(version: WatchVersion) -> ListIndex | MapIndex:
    """A list or map version read from its Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if version.kind == "watchlist":
        columns = ["source_id", "source_name", "ra", "dec", "radius_arcsec"]
        table = pa.concat_tables([pq.read_table(f, columns=columns) for f in version.files]) if version.files \
            else pa.table({c: pa.array([], pa.float64() if c in ("ra", "dec", "radius_arcsec") else pa.string())
                           for c in columns})
        return ListIndex(table["source_id"], table["source_name"],
                         *(table[c].to_numpy() for c in ("ra", "dec", "radius_arcsec")))
    columns = ["uniq", "probability_density", "credible_level"]
    table = pa.concat_tables([pq.read_table(f, columns=columns) for f in version.files]) if version.files \
        else pa.table({"uniq": pa.array([], pa.int64()), "probability_density": pa.array([], pa.float64()),
                       "credible_level": pa.array([], pa.float64())})
    return MapIndex(*(table[c].to_numpy(zero_copy_only=False) for c in columns))


def watch_outputs(versions: tuple[WatchVersion, ...], ra, dec, accepted=None) -> dict[str, list]:
    """Every list's and map's flat output columns (:func:`output_name`) for a batch of positions; rows where
    ``accepted`` is false (messages that did not decode) match nothing."""
    ra = np.asarray(ra, dtype=float)
    dec = np.asarray(dec, dtype=float)
    if accepted is not None:
        keep = np.asarray(accepted, dtype=bool)
        ra, dec = np.where(keep, ra, np.nan), np.where(keep, dec, np.nan)
    columns: dict[str, list] = {}
    for position, version in enumerate(versions):
        for field, values in loaded(version).outputs(ra, dec).items():
            columns[output_name(position, field)] = values
    return columns
