"""Helpers for writing filters in a notebook (``notebooks/filter_authoring.ipynb``).

Plain Python (fastavro, pandas, matplotlib, astropy): load sample alerts,
browse a schema's columns with their docs, draw an alert's light curve and
cutouts, and save a filter where the stream finds it.  Checking and testing
a filter use the stream's own Spark code (``skyfilter/tools/filter_tools.py``,
``skyfilter/tools/filter_trial.py``).
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import NAME_PATTERN
from skyfilter.schemas.avro import avro_files, read_container

# ZTF fid -> band name
ZTF_BANDS = {1: "g", 2: "r", 3: "i"}
CUTOUT_TITLES = ("cutoutScience", "cutoutTemplate", "cutoutDifference")


@dataclass
class Sample:
    """Sample alerts: their writer schema and decoded records."""

    schema: dict
    records: list[dict]
    paths: list[Path]

    def __len__(self) -> int:
        return len(self.records)


def load_sample(*paths: str | Path, limit: int | None = None) -> Sample:
    """Read alerts from Avro container files or folders (one schema)."""
    files = avro_files(list(paths))
    schema, records = None, []
    for path in files:
        file_schema, rows = read_container(path)
        schema = schema or file_schema
        records += [row.record for row in rows]
        if limit and len(records) >= limit:
            return Sample(schema, records[:limit], files)
    return Sample(schema, records, files)


def schema_columns(schema: dict) -> pd.DataFrame:
    """Every column a filter can use: dotted path, Avro type and the schema's doc string.

    Array fields (histories) appear with ``[]``; filters reach them with
    Spark's array functions (``exists``, ``size``, ``filter``...).
    """
    rows: list[tuple[str, str, str]] = []
    named: dict[str, dict] = {}

    def walk(fields: list[dict], prefix: str) -> None:
        for field in fields:
            path = prefix + field["name"]
            kind, record, is_array = _describe(field["type"], named)
            rows.append((path + ("[]" if is_array else ""), kind, (field.get("doc") or "").strip()))
            if record is not None and path.count(".") < 3:
                walk(record["fields"], path + ("[]." if is_array else "."))

    walk(schema["fields"], "")
    return pd.DataFrame(rows, columns=["column", "type", "doc"])


def _describe(avro_type, named: dict) -> tuple[str, dict | None, bool]:
    """(type label, nested record or None, is an array) of an Avro type."""
    if isinstance(avro_type, list):
        kinds = [t for t in avro_type if t != "null"]
        label, record, is_array = _describe(kinds[0], named) if len(kinds) == 1 else ("union", None, False)
        return (label + " (nullable)" if "null" in avro_type else label), record, is_array
    if isinstance(avro_type, str):
        if avro_type in named:
            return "record", named[avro_type], False
        return avro_type, None, False
    kind = avro_type.get("type")
    if kind == "record":
        named[avro_type["name"]] = avro_type
        if "namespace" in avro_type:
            named[f"{avro_type['namespace']}.{avro_type['name']}"] = avro_type
        return "record", avro_type, False
    if kind == "array":
        label, record, _ = _describe(avro_type["items"], named)
        return f"array<{label}>", record, True
    if kind in ("map", "enum", "fixed"):
        return kind, None, False
    return str(avro_type.get("logicalType") or kind), None, False


def light_curve(alert: dict) -> pd.DataFrame:
    """The alert's detections, history included: mjd, band, flux (nJy) or magnitude, error, is it the alert."""
    if "diaSource" in alert:  # Rubin
        rows = [(s["midpointMjdTai"], s.get("band"), s.get("psfFlux"), s.get("psfFluxErr"), False)
                for s in alert.get("prvDiaSources") or []]
        source = alert["diaSource"]
        rows.append((source["midpointMjdTai"], source.get("band"), source.get("psfFlux"), source.get("psfFluxErr"),
                     True))
        return pd.DataFrame(rows, columns=["mjd", "band", "flux", "error", "current"]).sort_values("mjd")
    if "candidate" in alert:  # ZTF: magnitudes, JD
        rows = [(c["jd"] - 2400000.5, ZTF_BANDS.get(c.get("fid")), c.get("magpsf"), c.get("sigmapsf"), False)
                for c in alert.get("prv_candidates") or [] if c.get("magpsf") is not None]
        c = alert["candidate"]
        rows.append((c["jd"] - 2400000.5, ZTF_BANDS.get(c.get("fid")), c["magpsf"], c["sigmapsf"], True))
        return pd.DataFrame(rows, columns=["mjd", "band", "magnitude", "error", "current"]).sort_values("mjd")
    raise SkyfilterError("not a Rubin or ZTF alert: no diaSource or candidate field")


def cutout_image(value):
    """A cutout as a 2-D array: Rubin's raw FITS bytes or ZTF's gzipped FITS stamp."""
    from astropy.io import fits

    if isinstance(value, dict):
        value = value.get("stampData")
    if not value:
        return None
    data = gzip.decompress(value) if value[:2] == b"\x1f\x8b" else value
    with fits.open(io.BytesIO(data)) as hdus:
        for hdu in hdus:
            if hdu.data is not None and getattr(hdu.data, "ndim", 0) == 2:
                return hdu.data.copy()
    return None


def plot_alert(alert: dict, title: str | None = None):
    """One figure: the light curve from the alert's history, then its three cutouts."""
    import matplotlib.pyplot as plt
    import numpy as np

    figure, axes = plt.subplots(1, 4, figsize=(16, 3.6), gridspec_kw={"width_ratios": [2.2, 1, 1, 1]})
    curve = light_curve(alert)
    value = "flux" if "flux" in curve else "magnitude"
    for band, points in curve.groupby("band", dropna=False):
        axes[0].errorbar(points["mjd"], points[value], yerr=points["error"], fmt="o", ms=4, label=str(band))
    current = curve[curve["current"]]
    axes[0].plot(current["mjd"], current[value], "k*", ms=14, label="this alert")
    axes[0].set_xlabel("MJD")
    axes[0].set_ylabel("PSF flux (nJy)" if value == "flux" else "PSF magnitude")
    if value == "magnitude":
        axes[0].invert_yaxis()
    axes[0].legend(fontsize=8)
    axes[0].set_title(title or "light curve")
    for axis, name in zip(axes[1:], CUTOUT_TITLES, strict=True):
        image = cutout_image(alert.get(name))
        if image is not None:
            low, high = np.nanpercentile(image, [1, 99])
            axis.imshow(image, origin="lower", cmap="gray", vmin=low, vmax=high)
        axis.set_title(name.removeprefix("cutout").lower())
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout()
    return figure


def save_filter(name: str, text: str, folder: str | Path = "filters", kind: str = "sql") -> Path:
    """Write a filter file (``<name>.sql`` or ``<name>.py``) into the filters folder the stream reads."""
    if not NAME_PATTERN.match(name):
        raise SkyfilterError(f"filter name '{name}' must be letters, digits and _")
    if kind not in ("sql", "py"):
        raise SkyfilterError("kind is 'sql' or 'py'")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.{kind}"
    path.write_text(text.strip() + "\n")
    return path
