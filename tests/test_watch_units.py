"""Watchlists and watchmaps without Spark: matching against a brute-force separation over every pair, MOC and
skymap containment against mocpy's own functions, and the one-line refusals of bad files."""

from __future__ import annotations

import numpy as np
import pytest

from skyfilter.core.errors import SkyfilterError
from skyfilter.watch.crossmatch import TOLERANCE_ARCSEC, ListIndex, MapIndex
from skyfilter.watch.files import read_watchlist, read_watchmap


def brute_force_separation(ra1, dec1, ra2, dec2) -> np.ndarray:
    """Every pair's angular separation (arcsec), by the haversine formula: independent of astropy's KD-tree."""
    ra1, dec1, ra2, dec2 = (np.radians(np.asarray(a, dtype=float)) for a in (ra1, dec1, ra2, dec2))
    d_ra = ra2[None, :] - ra1[:, None]
    d_dec = dec2[None, :] - dec1[:, None]
    h = np.sin(d_dec / 2) ** 2 + np.cos(dec1)[:, None] * np.cos(dec2)[None, :] * np.sin(d_ra / 2) ** 2
    return np.degrees(2 * np.arcsin(np.sqrt(np.clip(h, 0, 1)))) * 3600


def crafted_pairs():
    """(source ra, dec, radius, alert ra, dec, should match) at the awkward places of the sphere."""
    r = 5.0
    exact = r / 3600
    return [
        (359.9995, 0.0, 4.0, 0.0005, 0.0, True),                  # across RA 0/360: 3.6 arcsec
        (0.0002, -30.0, 2.0, 359.9999, -30.0, True),              # the other way round
        (0.0, 89.9995, 4.0, 180.0, 89.9995, True),                # across the north pole: 3.6 arcsec
        (90.0, -89.9999, 1.0, 270.0, -90.0, True),                # at the south pole itself: 0.36 arcsec
        (45.0, 10.0, r, 45.0, 10.0 + exact, True),                # exactly at the radius (along the meridian)
        (200.0, -45.0, r, 200.0, -45.0 - exact, True),
        (45.5, 10.0, r, 45.5, 10.0 + exact + 0.001 / 3600, False),  # 1 mas beyond it
        (120.0, 60.0, 3600.0, 120.0, 60.999, True),               # a 1-degree radius
    ]


def test_watchlist_matches_equal_a_brute_force_search_over_every_pair():
    rng = np.random.default_rng(7)
    sources = 3000
    ra = rng.uniform(0, 360, sources)
    dec = np.degrees(np.arcsin(rng.uniform(-1, 1, sources)))
    radius = rng.uniform(0.5, 30, sources)
    crafted = crafted_pairs()
    ra = np.concatenate([ra, [c[0] for c in crafted]])
    dec = np.concatenate([dec, [c[1] for c in crafted]])
    radius = np.concatenate([radius, [c[2] for c in crafted]])
    # alerts: near some sources (inside and outside their radius), random ones, and the crafted ones
    near = rng.choice(sources, 800, replace=False)
    offset = rng.uniform(0, 40, near.size) / 3600
    alert_ra = np.concatenate([(ra[near] + offset / np.cos(np.radians(dec[near])).clip(0.05)) % 360,
                               rng.uniform(0, 360, 2000), [c[3] for c in crafted]])
    alert_dec = np.concatenate([np.clip(dec[near], -90, 90), np.degrees(np.arcsin(rng.uniform(-1, 1, 2000))),
                                [c[4] for c in crafted]])
    ids = np.array([f"s{i}" for i in range(ra.size)], dtype=object)
    index = ListIndex(ids, ids, ra, dec, radius)
    nearest, separation = index.match(alert_ra, alert_dec)

    pairs = brute_force_separation(alert_ra, alert_dec, ra, dec)
    within = pairs <= radius[None, :] + TOLERANCE_ARCSEC
    expected_match = within.any(axis=1)
    assert (nearest >= 0).tolist() == expected_match.tolist()
    assert 200 < expected_match.sum() < 1500  # the test has matches and misses both
    masked = np.where(within, pairs, np.inf)
    expected_nearest = masked.argmin(axis=1)
    matched = np.flatnonzero(expected_match)
    assert np.abs(separation[matched] - masked[matched, expected_nearest[matched]]).max() < 1e-5
    ties = np.isclose(masked[matched].min(axis=1), masked[matched, nearest[matched]], atol=1e-5)
    assert ties.all()
    for k, (*_, should) in enumerate(crafted):
        alert, source = len(alert_ra) - len(crafted) + k, sources + k
        assert (nearest[alert] == source) == should, crafted[k]


def test_watchlist_matches_nothing_for_missing_positions_and_keeps_the_nearest_of_several():
    index = ListIndex(["far", "near"], [None, "n"], [10.0, 10.0], [0.0, 0.0005], [10.0, 10.0])
    nearest, separation = index.match(np.array([10.0, np.nan, 10.0]), np.array([0.0004, 5.0, np.nan]))
    assert nearest.tolist() == [1, -1, -1]
    assert abs(separation[0] - 0.36) < 1e-6
    outputs = index.outputs(np.array([10.0]), np.array([0.0004]))
    assert outputs["source_id"] == ["near"] and outputs["source_name"] == ["n"] and outputs["matched"] == [True]


def _moc_file(tmp_path):
    from astropy import units as u
    from mocpy import MOC

    moc = MOC.from_cones(lon=[10, 200, 359.5] * u.deg, lat=[20, -60, 0] * u.deg, radius=[2, 5, 3] * u.deg,
                         max_depth=10, union_strategy="large_cones")
    path = tmp_path / "region.moc.fits"
    moc.save(path, format="fits", overwrite=True)
    return moc, path


def _random_positions(count: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 360, count), np.degrees(np.arcsin(rng.uniform(-1, 1, count)))


def test_a_moc_holds_exactly_what_mocpy_says_it_holds(tmp_path):
    import astropy.units as u

    moc, path = _moc_file(tmp_path)
    sky = read_watchmap(path, 0.9)
    assert sky.kind == "moc"
    index = MapIndex(sky.uniq, sky.probability_density, sky.credible_level)
    ra, dec = _random_positions(200_000)
    rng = np.random.default_rng(4)  # and many near the cones' edges, where cells of every depth meet
    edge_ra = np.concatenate([rng.uniform(5, 15, 30_000), rng.uniform(185, 215, 30_000),
                              rng.uniform(-4, 4, 30_000) % 360])
    edge_dec = np.concatenate([rng.uniform(15, 25, 30_000), rng.uniform(-67, -53, 30_000),
                               rng.uniform(-4, 4, 30_000)])
    ra = np.concatenate([ra, edge_ra, [10.0, 200.0, 359.9, 0.2]])
    dec = np.concatenate([dec, edge_dec, [20.0, -60.0, 0.0, 0.0]])
    inside = index.cells(ra, dec) >= 0
    assert inside.tolist() == moc.contains_lonlat(ra * u.deg, dec * u.deg).tolist()
    assert inside[-4:].all() and 20_000 < inside.sum() < 70_000


def _multiorder_skymap(path, seed: int = 5):
    """A synthetic multi-order skymap (UNIQ, PROBDENSITY per steradian) at depths 3 and 4, as LIGO writes them."""
    from astropy.io import fits

    rng = np.random.default_rng(seed)
    coarse = 4 * 4 ** 3 + np.arange(12 * 4 ** 3)[::2]              # every other depth-3 cell...
    fine = 4 * 4 ** 4 + (np.arange(12 * 4 ** 3)[1::2, None] * 4 + np.arange(4)).ravel()  # ...and the others split
    uniq = np.concatenate([coarse, fine])
    density = rng.gamma(0.5, 1.0, uniq.size)
    depth = np.where(uniq >= 4 * 4 ** 4, 4, 3)
    density /= (density * 4 * np.pi / (12 * 4 ** depth)).sum()
    table = fits.BinTableHDU.from_columns([fits.Column("UNIQ", "K", array=uniq),
                                           fits.Column("PROBDENSITY", "D", array=density)])
    table.header.update({"PIXTYPE": "HEALPIX", "ORDERING": "NUNIQ", "COORDSYS": "C", "MOCORDER": 4,
                         "INDXSCHM": "EXPLICIT"})
    fits.HDUList([fits.PrimaryHDU(), table]).writeto(path, overwrite=True)


def test_a_skymap_keeps_the_credible_region_mocpy_keeps(tmp_path):
    import astropy.units as u
    from astropy.io import fits
    from mocpy import MOC

    path = tmp_path / "S251112cm.multiorder.fits"
    _multiorder_skymap(path)
    sky = read_watchmap(path, 0.9)
    assert sky.kind == "skymap" and np.nanmax(sky.credible_level) <= 0.9 + 1e-9
    index = MapIndex(sky.uniq, sky.probability_density, sky.credible_level)
    ra, dec = _random_positions(100_000, 11)
    cell = index.cells(ra, dec)
    with fits.open(path) as hdus:
        uniq, density = np.asarray(hdus[1].data["UNIQ"]), np.asarray(hdus[1].data["PROBDENSITY"])
    region = MOC.from_valued_healpix_cells(uniq, density, max_depth=4, values_are_densities=True, cumul_to=0.9)
    assert 0.2 < region.sky_fraction < 0.8
    assert (cell >= 0).tolist() == region.contains_lonlat(ra * u.deg, dec * u.deg).tolist()
    levels = index.outputs(ra, dec)["credible_level"]
    inside_levels = np.array([v for v in levels if v is not None])
    assert inside_levels.size and inside_levels.max() <= 0.9 + 1e-9
    # denser cells have lower credible levels
    order = np.argsort(-index.density)
    assert np.all(np.diff(index.level[order]) >= 0)


@pytest.mark.parametrize(("text", "message"), [
    ("id,ra,dec\na,10,20\nb,,5\n", "row 3: ra is missing"),
    ("id,ra,dec\na,10,95\n", "row 2: dec 95 is not within -90..90"),
    ("id,ra,dec\na,360,5\n", "row 2: ra 360 is not within 0 <= ra < 360"),
    ("id,ra,dec\na,ten,5\n", "row 2: ra 'ten' is not a number"),
    ("id,ra,dec\na,1,5\nb,2,5\na,3,5\n", "rows 2 and 4: duplicate id 'a'"),
    ("id,ra,dec,radius\na,1,5,0\n", "row 2: radius 0 arcsec must be > 0 and <= 3600 (1 degree)"),
    ("id,ra,dec,radius\na,1,5,2\nb,1,6,3601\n", "row 3: radius 3601 arcsec must be > 0"),
    ("id,dec\na,5\n", "no 'ra' column (it has: id, dec)"),
    ("id,ra,dec\n", "no sources"),
])
def test_a_bad_watchlist_file_is_one_line_naming_the_file_and_row(tmp_path, text, message):
    path = tmp_path / "agn.csv"
    path.write_text(text)
    with pytest.raises(SkyfilterError) as error:
        read_watchlist(path, 2.0)
    assert str(error.value).startswith(str(path)) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_watchlists_read_parquet_fits_and_votable_alike(tmp_path):
    import pandas as pd
    from astropy.table import Table

    rows = pd.DataFrame({"ID": ["x", "y"], "RA": [1.0, 2.0], "DEC": [3.0, -4.0], "radius": [1.5, np.nan]})
    rows.to_parquet(tmp_path / "list.parquet")
    Table.from_pandas(rows).write(tmp_path / "list.fits")
    Table.from_pandas(rows).write(tmp_path / "list.vot", format="votable")
    for name in ("list.parquet", "list.fits", "list.vot"):
        read = read_watchlist(tmp_path / name, 2.5)
        assert read["source_id"].tolist() == ["x", "y"]
        assert read["radius_arcsec"].tolist() == [1.5, 2.5]


def test_unknown_formats_and_files_that_are_not_maps_are_refused_in_one_line(tmp_path):
    (tmp_path / "agn.txt").write_text("id ra dec\n")
    with pytest.raises(SkyfilterError, match=r"agn.txt: unknown file format '.txt'"):
        read_watchlist(tmp_path / "agn.txt", 2.0)
    (tmp_path / "broken.fits").write_bytes(b"SIMPLE  = not a fits file at all" * 10)
    with pytest.raises(SkyfilterError, match=r"broken.fits: not a MOC or HEALPix skymap: "):
        read_watchmap(tmp_path / "broken.fits", 0.9)
    (tmp_path / "region.png").write_bytes(b"\x89PNG")
    with pytest.raises(SkyfilterError, match=r"region.png: unknown file format"):
        read_watchmap(tmp_path / "region.png", 0.9)


def test_a_flat_ring_skymap_keeps_the_same_region_as_mocpy(tmp_path):
    import astropy.units as u
    from astropy.io import fits
    from astropy_healpix.core import ring_to_nested
    from mocpy import MOC

    nside = 16
    rng = np.random.default_rng(9)
    probability = rng.gamma(0.5, 1.0, 12 * nside * nside)
    probability /= probability.sum()
    column = fits.Column("PROB", "D", array=probability)
    table = fits.BinTableHDU.from_columns([column])
    table.header.update({"PIXTYPE": "HEALPIX", "ORDERING": "RING", "NSIDE": nside, "INDXSCHM": "IMPLICIT"})
    path = tmp_path / "flat.fits"
    fits.HDUList([fits.PrimaryHDU(), table]).writeto(path)
    sky = read_watchmap(path, 0.5)
    index = MapIndex(sky.uniq, sky.probability_density, sky.credible_level)
    uniq = 4 * nside * nside + ring_to_nested(np.arange(probability.size), nside)
    region = MOC.from_valued_healpix_cells(uniq, probability, max_depth=4, cumul_to=0.5)
    ra, dec = _random_positions(50_000, 2)
    assert (index.cells(ra, dec) >= 0).tolist() == region.contains_lonlat(ra * u.deg, dec * u.deg).tolist()
    area = 41252.96124941928 / probability.size
    assert np.allclose(np.sort(sky.probability_density * area), np.sort(probability)[-sky.uniq.size:])


def test_a_broker_subscribes_to_lists_and_maps_as_filters_of_their_own(tmp_path):
    from skyfilter.core.brokers import load_brokers

    path = tmp_path / "brokers.yaml"
    path.write_text("brokers:\n  watchers:\n    watchlists: [my_agn]\n    watchmaps: S251112cm\n"
                    "  both:\n    filters: [bright]\n    watchlists: [my_agn]\n")
    watchers, both = load_brokers(path)
    assert watchers.filters == ("watchlist:my_agn", "watchmap:S251112cm")
    assert both.filters == ("bright", "watchlist:my_agn")
    path.write_text("brokers:\n  nothing:\n    topic: t\n")
    with pytest.raises(SkyfilterError, match="'filters' \\(or 'watchlists', 'watchmaps'\\) must name at least one"):
        load_brokers(path)
