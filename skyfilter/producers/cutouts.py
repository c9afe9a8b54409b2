"""Postage-stamp cutouts as real FITS files (primary HDU, float32 image, TAN WCS)."""

from __future__ import annotations

import numpy as np

BLOCK = 2880


def _card(key: str, value, comment: str = "") -> str:
    if isinstance(value, bool):
        text = "T" if value else "F"
        text = f"{text:>20}"
    elif isinstance(value, str):
        text = f"'{value:<8}'"
        text = f"{text:<20}"
    elif isinstance(value, int):
        text = f"{value:>20d}"
    else:
        text = f"{value:>20.12G}"
    card = f"{key:<8}= {text}"
    if comment:
        card += f" / {comment}"
    return f"{card:<80}"[:80]


def fits_image(image: np.ndarray, ra: float, dec: float, pixel_scale_arcsec: float = 0.2,
               bunit: str = "nJy") -> bytes:
    """Encode a 2-D image as a FITS file centred on (ra, dec) degrees."""
    ny, nx = image.shape
    cards = [
        _card("SIMPLE", True, "conforms to FITS standard"),
        _card("BITPIX", -32, "32-bit IEEE float"),
        _card("NAXIS", 2),
        _card("NAXIS1", nx),
        _card("NAXIS2", ny),
        _card("CTYPE1", "RA---TAN"),
        _card("CTYPE2", "DEC--TAN"),
        _card("CRPIX1", (nx + 1) / 2.0),
        _card("CRPIX2", (ny + 1) / 2.0),
        _card("CRVAL1", float(ra)),
        _card("CRVAL2", float(dec)),
        _card("CDELT1", -pixel_scale_arcsec / 3600.0),
        _card("CDELT2", pixel_scale_arcsec / 3600.0),
        _card("BUNIT", bunit),
        f"{'END':<80}",
    ]
    header = "".join(cards).encode("ascii")
    header += b" " * (-len(header) % BLOCK)
    data = np.ascontiguousarray(image, dtype=">f4").tobytes()
    data += b"\0" * (-len(data) % BLOCK)
    return header + data


def alert_stamps(rng: np.random.Generator, ra: float, dec: float, flux_njy: float,
                 size: int = 100, sky_sigma_njy: float = 60.0) -> tuple[bytes, bytes, bytes]:
    """(difference, science, template) stamps: a PSF source on noise, template minus science."""
    y, x = np.mgrid[0:size, 0:size] - (size - 1) / 2.0
    psf = np.exp(-(x * x + y * y) / (2 * 2.0**2))
    psf /= psf.sum()
    template = rng.normal(0.0, sky_sigma_njy, (size, size)).astype(np.float32)
    science = template + rng.normal(0.0, sky_sigma_njy / 2, (size, size)) + flux_njy * psf
    difference = science - template
    return (fits_image(difference, ra, dec), fits_image(science, ra, dec), fits_image(template, ra, dec))
