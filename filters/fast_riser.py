"""Objects that brightened by more than 1 magnitude within 5 days of an earlier detection."""

import numpy as np

from skyfilter import alert_filter


# History fields named one by one: each arrives as an array of numbers per alert,
# far cheaper to hand to Python than the history's whole records.
@alert_filter(columns=["diaSource.psfFlux", "diaSource.midpointMjdTai",
                       "prvDiaSources.psfFlux", "prvDiaSources.midpointMjdTai"])
def fast_riser(flux, mjd, earlier_flux, earlier_mjd):
    def rose(now_flux, now_mjd, fluxes, mjds):
        if fluxes is None or len(fluxes) == 0:
            return False
        fluxes, age = np.asarray(fluxes, dtype=float), now_mjd - np.asarray(mjds, dtype=float)
        recent = (age > 0) & (age < 5) & (fluxes > 0)
        return bool(recent.any()) and now_flux > 2.5 * fluxes[recent].max()

    return np.array([rose(*alert) for alert in zip(flux, mjd, earlier_flux, earlier_mjd, strict=True)], dtype=bool)
