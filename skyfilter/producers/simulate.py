"""Simulated Rubin alerts with realistic values, valid against an lsst-alert-packet schema.

Every alert is a function of (seed, visit index, alert index) alone, so the
same night comes out identical whatever the number of producer processes.
What a filter can select on is realistic: positions inside a visit's
footprint, AB magnitudes with a faint-heavy distribution, fluxes and errors
at Rubin's single-visit depth, SNR, band, a bimodal real/bogus reliability,
and a light curve history (``prvDiaSources``) of the same object.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from skyfilter.core.alert_columns import MJD_UNIX_EPOCH
from skyfilter.producers.cutouts import alert_stamps
from skyfilter.schemas.avro import blank_value

BANDS = ("u", "g", "r", "i", "z", "y")
BAND_WEIGHTS = (0.07, 0.1, 0.22, 0.22, 0.2, 0.19)
FIVE_SIGMA_DEPTH = {"u": 23.9, "g": 25.0, "r": 24.7, "i": 24.0, "z": 23.3, "y": 22.1}
NJY_ZERO_POINT = 31.4  # AB magnitude of 1 nJy
FIELD_RADIUS_DEG = 1.75
NIGHT_START_UTC = dt.time(23, 30)  # evening twilight at Cerro Pachon, in UTC


def mag_to_njy(mag: float) -> float:
    return 10 ** ((NJY_ZERO_POINT - mag) / 2.5)


def record_type(field_type) -> dict:
    """The record schema inside a (possibly nullable, possibly array) field type."""
    if isinstance(field_type, list):
        field_type = next(t for t in field_type if t != "null")
    if isinstance(field_type, dict) and field_type.get("type") == "array":
        field_type = field_type["items"]
    return field_type


def fill(template: dict, values: dict) -> dict:
    """A copy of a blank record with the values whose names the schema has."""
    record = dict(template)
    record.update({k: v for k, v in values.items() if k in template})
    return record


@dataclass(frozen=True)
class Visit:
    """One exposure's pointing and timing."""

    index: int
    visit_id: int
    mjd: float
    band: str
    ra: float
    dec: float


class AlertSimulator:
    """Builds the alerts of a simulated night for one Rubin schema."""

    def __init__(self, schema: dict, night: str, seed: int = 0, stamps: bool = True,
                 history_length: int = 30, stamp_size: int = 100, interval_s: float = 39.0):
        self.schema = schema
        self.night = dt.date.fromisoformat(night)
        self.seed = seed
        self.stamps = stamps
        self.history_length = history_length
        self.stamp_size = stamp_size
        self.interval_s = interval_s
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        self.alert_template = blank_value(schema)
        self.source_template = blank_value(record_type(fields["diaSource"]))
        self.object_template = blank_value(record_type(fields["diaObject"])) if "diaObject" in fields else None
        start = dt.datetime.combine(self.night, NIGHT_START_UTC, tzinfo=dt.UTC)
        self.start_mjd = start.timestamp() / 86400.0 + MJD_UNIX_EPOCH

    def visit(self, index: int) -> Visit:
        """The pointing of visit ``index`` of the night (southern sky, one band)."""
        rng = np.random.default_rng([self.seed, index, 1])
        return Visit(
            index=index,
            visit_id=int(self.night.strftime("%Y%m%d")) * 100000 + index + 1,
            mjd=self.start_mjd + index * self.interval_s / 86400.0,
            band=str(rng.choice(BANDS, p=BAND_WEIGHTS)),
            ra=float(rng.uniform(0.0, 360.0)),
            dec=float(np.degrees(np.arcsin(rng.uniform(-0.94, 0.09)))),  # about -70 to +5 deg
        )

    def alert(self, visit: Visit, index: int) -> dict:
        """Alert ``index`` of a visit, as a record for the schema."""
        rng = np.random.default_rng([self.seed, visit.index, index, 2])
        radius = FIELD_RADIUS_DEG * math.sqrt(rng.uniform())
        angle = rng.uniform(0, 2 * math.pi)
        dec = visit.dec + radius * math.sin(angle)
        ra = (visit.ra + radius * math.cos(angle) / max(math.cos(math.radians(dec)), 0.05)) % 360.0
        depth = FIVE_SIGMA_DEPTH[visit.band]
        mag = depth - 7.0 * rng.beta(1.0, 5.0)  # faint-heavy: most near the 5-sigma depth
        flux_err = mag_to_njy(depth) / 5.0
        is_negative = bool(rng.uniform() < 0.25)
        flux = mag_to_njy(mag) * (-1.0 if is_negative else 1.0) + rng.normal(0, flux_err)
        real = rng.uniform() < 0.4
        reliability = float(rng.beta(6, 1.2) if real else rng.beta(1.2, 6))
        object_id = int(rng.integers(1, 2**62))
        source_id = visit.visit_id * 100000 + index
        source = self._source(source_id, visit, object_id, ra, dec, flux, flux_err, visit.band, visit.mjd,
                              reliability, is_negative, rng)
        history = self._history(rng, object_id, ra, dec, flux, flux_err, visit)
        alert = fill(self.alert_template, {
            "diaSourceId": source_id, "alertId": source_id,  # (alertId: schemas before 8.0)
            "diaSource": source,
            "prvDiaSources": history,
            "diaObject": self._object(object_id, ra, dec, history + [source]),
        })
        if self.stamps:
            difference, science, template = alert_stamps(rng, ra, dec, flux, self.stamp_size)
            alert.update({k: v for k, v in (("cutoutDifference", difference), ("cutoutScience", science),
                                             ("cutoutTemplate", template)) if k in alert})
        return alert

    def _source(self, source_id, visit, object_id, ra, dec, flux, flux_err, band, mjd, reliability,
                is_negative, rng) -> dict:
        flux, mjd, is_negative = float(flux), float(mjd), bool(is_negative)
        snr = abs(flux) / flux_err
        return fill(self.source_template, {
            "diaSourceId": source_id, "visit": visit.visit_id, "detector": int(rng.integers(0, 189)),
            "diaObjectId": object_id, "midpointMjdTai": mjd, "exposureTime": 30.0,
            "ra": ra, "dec": dec, "raErr": float(0.1 / 3600 / max(snr, 1) * 10),
            "decErr": float(0.1 / 3600 / max(snr, 1) * 10),
            "x": float(rng.uniform(0, 4096)), "y": float(rng.uniform(0, 4096)),
            "psfFlux": float(flux), "psfFluxErr": float(flux_err), "snr": float(snr),
            "apFlux": float(flux * rng.normal(1.0, 0.05)), "apFluxErr": float(flux_err * 1.2),
            "scienceFlux": float(abs(flux) + mag_to_njy(22.0)), "scienceFluxErr": float(flux_err),
            "templateFlux": float(mag_to_njy(22.0)), "templateFluxErr": float(flux_err),
            "band": band, "reliability": reliability, "isNegative": is_negative,
            "extendedness": float(rng.uniform()), "timeProcessedMjdTai": mjd + 60 / 86400.0,
            "psfNdata": 400, "bboxSize": 25,
            # the names of schemas before 8.0 (before 5.0 for the last three)
            "ccdVisitId": visit.visit_id, "midPointTai": mjd, "psFlux": float(flux), "filterName": band,
        })

    def _history(self, rng, object_id, ra, dec, flux, flux_err, visit) -> list[dict]:
        """Earlier detections of the same object over the past ~30 days."""
        count = int(rng.integers(0, self.history_length + 1))
        rising = rng.uniform() < 0.2
        history = []
        for k, days_ago in enumerate(sorted(rng.uniform(0.5, 30.0, count), reverse=True)):
            band = str(rng.choice(BANDS, p=BAND_WEIGHTS))
            earlier = flux * (0.1 + 0.9 * (1 - days_ago / 30.0)) if rising else flux * rng.normal(1.0, 0.3)
            history.append(self._source(
                (visit.visit_id - 1000 * (k + 1)) * 100000 + int(rng.integers(0, 99999)), visit, object_id,
                ra, dec, float(earlier), flux_err, band, visit.mjd - days_ago, float(rng.beta(6, 1.2)),
                earlier < 0, rng))
        return history

    def _object(self, object_id, ra, dec, sources) -> dict | None:
        if self.object_template is None:
            return None
        values = {"diaObjectId": object_id, "ra": ra, "dec": dec, "nDiaSources": len(sources),
                  "validityStartMjdTai": sources[-1].get("midpointMjdTai")}
        for band in BANDS:
            fluxes = [s.get("psfFlux", s.get("psFlux")) for s in sources if s.get("band", s.get("filterName")) == band]
            if fluxes:
                values[f"{band}_psfFluxMean"] = float(np.mean(fluxes))
                values[f"{band}_psfFluxNdata"] = len(fluxes)
                values[f"{band}_psfFluxSigma"] = float(np.std(fluxes))
        return fill(self.object_template, values)
