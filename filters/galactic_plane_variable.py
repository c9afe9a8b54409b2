"""Reliable detections within 10 degrees of the Galactic plane."""

import numpy as np

from skyfilter import alert_filter

# Galactic north pole and the ascending node, J2000 (degrees).
POLE_RA, POLE_DEC = np.radians(192.85948), np.radians(27.12825)


@alert_filter(columns=["diaSource.ra", "diaSource.dec", "diaSource.reliability"])
def galactic_plane_variable(ra, dec, reliability):
    ra, dec = np.radians(ra.to_numpy()), np.radians(dec.to_numpy())
    sin_b = np.sin(dec) * np.sin(POLE_DEC) + np.cos(dec) * np.cos(POLE_DEC) * np.cos(ra - POLE_RA)
    latitude = np.degrees(np.arcsin(np.clip(sin_b, -1, 1)))
    return (np.abs(latitude) < 10) & (reliability.to_numpy() > 0.5)
