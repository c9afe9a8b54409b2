"""Objects that brightened by more than 1 magnitude within 5 days of an earlier detection."""

import numpy as np

from skyfilter import alert_filter


@alert_filter(columns=["diaSource.psfFlux", "diaSource.midpointMjdTai", "prvDiaSources"])
def fast_riser(flux, mjd, history):
    def rose(now_flux, now_mjd, earlier):
        recent = [s["psfFlux"] for s in (earlier if earlier is not None else [])
                  if 0 < now_mjd - s["midpointMjdTai"] < 5 and s["psfFlux"] and s["psfFlux"] > 0]
        return bool(recent) and now_flux > 2.5 * max(recent)

    return np.array([rose(f, m, h) for f, m, h in zip(flux, mjd, history, strict=True)], dtype=bool)
