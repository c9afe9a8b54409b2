"""Watchlists and watchmaps on a real stream: filters in SQL and Python and broker subscriptions match what a
brute-force search and mocpy say, the match travels in a header, the lite record and the matches table, a new
list version reaches the running stream, Real-time Mode matches the same, and a re-filter reads the night's
version or today's."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from test_watch_units import brute_force_separation

from conftest import (
    ARCHIVE_IN_THE_DRIVER,
    consume_avro,
    decode_messages,
    run_saying,
    saying,
    stream_args,
    stream_folder,
)
from skyfilter.cli import main as skyfilter
from skyfilter.jobs import replay_night
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.producers.simulate import AlertSimulator
from skyfilter.schemas.avro import rubin_schema
from skyfilter.watch.crossmatch import TOLERANCE_ARCSEC

TOPIC = "watch.alerts"
NIGHT = "2026-11-24"
SEED = 21
RADIUS = 2.0
FILTERS = {
    "near_agn.sql": "watchlists.w_agn.matched",
    "agn_lite.sql": "SELECT alert_id, watchlists.w_agn.source_id AS agn_id FROM alerts\n"
                    "WHERE watchlists.w_agn.matched",
    "typo.sql": "watchlists.w_agm.matched",
    "in_region.py": "from skyfilter import alert_filter\n\n\n"
                    "@alert_filter(columns=['watchmaps.w_region.inside'])\n"
                    "def in_region(inside):\n    return inside.astype(bool)\n",
}
BROKERS = """max_alerts_per_visit: null
brokers:
  w_full:
    filters: [near_agn, typo]
  w_lite:
    filters: [agn_lite]
    format: lite
    topic: w.lite
  w_sub:
    watchlists: [w_agn]
    watchmaps: [w_region]
    format: nocutouts
  w_py:
    filters: [in_region]
"""
RT_BROKERS = """max_alerts_per_visit: null
brokers:
  w_rt:
    watchlists: [w_agn]
    watchmaps: [w_region]
  w_rt_py:
    filters: [in_region]
"""


def positions(visit_index: int, alerts: int) -> dict[str, tuple[float, float]]:
    """alert id -> (ra, dec) of a simulated visit, computed without Kafka (the simulator is deterministic)."""
    simulator = AlertSimulator(rubin_schema("10.0"), NIGHT, SEED, stamps=False)
    visit = simulator.visit(visit_index)
    found = {}
    for index in range(alerts):
        source = simulator.alert(visit, index)["diaSource"]
        found[str(source["diaSourceId"])] = (source["ra"], source["dec"])
    return found


def watchlist_rows(near: dict[str, tuple[float, float]], prefix: str) -> list[tuple[str, float, float, float]]:
    """Sources beside some alerts: inside the radius, exactly at it, and 10 mas beyond it, in turn."""
    rows = []
    for k, (ra, dec) in enumerate(near.values()):
        offset = (0.5 * RADIUS, RADIUS, RADIUS + 0.01)[k % 3] / 3600
        rows.append((f"{prefix}{k}", ra, dec + offset if dec < 80 else dec - offset, RADIUS))
    return rows


def write_list(path, rows) -> None:
    path.write_text("id,ra,dec,radius\n" + "".join(f"{i},{ra!r},{dec!r},{r}\n" for i, ra, dec, r in rows))


def expected_list(alerts: dict[str, tuple[float, float]], rows) -> dict[str, tuple[str, float]]:
    """alert id -> (nearest source id, separation) within the radius, by brute force over every pair."""
    ids = list(alerts)
    pairs = brute_force_separation([alerts[i][0] for i in ids], [alerts[i][1] for i in ids],
                                   [r[1] for r in rows], [r[2] for r in rows])
    radius = np.array([r[3] for r in rows])
    found = {}
    for a, alert_id in enumerate(ids):
        within = np.flatnonzero(pairs[a] <= radius + TOLERANCE_ARCSEC)
        if within.size:
            best = within[np.argmin(pairs[a, within])]
            found[alert_id] = (rows[best][0], pairs[a, best])
    return found


def expected_region(moc, alerts: dict[str, tuple[float, float]]) -> set[str]:
    import astropy.units as u

    ids = list(alerts)
    inside = moc.contains_lonlat(np.array([alerts[i][0] for i in ids]) * u.deg,
                                 np.array([alerts[i][1] for i in ids]) * u.deg)
    return {alert_id for alert_id, flag in zip(ids, inside, strict=True) if flag}


def watch_command(cfg, *words: str) -> None:
    assert skyfilter([*words, "--state-dir", str(cfg.state_dir)]) == 0


@pytest.fixture(scope="module")
def night(kafka_cfg, spark, tmp_path_factory):
    from astropy import units as u
    from mocpy import MOC

    folder = stream_folder(tmp_path_factory.mktemp("watch"), FILTERS, BROKERS)
    first = {**positions(0, 40), **positions(1, 40)}
    ids = sorted(first)
    v0 = watchlist_rows({i: first[i] for i in ids[::5]}, "agn")  # 16 sources beside 16 alerts
    write_list(folder / "agn_v0.csv", v0)
    watch_command(kafka_cfg, "watchlist", "add", "w_agn", str(folder / "agn_v0.csv"))
    ringed = [first[i] for i in ids[1::7]]
    moc = MOC.from_cones(lon=[p[0] for p in ringed] * u.deg, lat=[p[1] for p in ringed] * u.deg,
                         radius=[0.01] * len(ringed) * u.deg, max_depth=14, union_strategy="small_cones")
    moc.save(folder / "region.moc.fits", format="fits", overwrite=True)
    watch_command(kafka_cfg, "watchmap", "add", "w_region", str(folder / "region.moc.fits"))

    produce(kafka_cfg, ProduceOptions(topic=TOPIC, visits=2, alerts_per_visit=40, interval_s=0.0, stamps=False,
                                      seed=SEED, night=NIGHT, progress=False))
    lines: list[str] = []
    with saying(lines):
        run(stream_args(kafka_cfg, TOPIC, folder / "filters", folder / "brokers.yaml",
                        extra=["--starting-offsets", "earliest"]), spark)
    records = decode_messages(read_topic(kafka_cfg, TOPIC), rubin_schema("10.0"))
    assert {str(r["diaSourceId"]): (r["diaSource"]["ra"], r["diaSource"]["dec"]) for r in records} == first
    return {"cfg": kafka_cfg, "folder": folder, "lines": lines, "alerts": first, "v0": v0, "moc": moc}


def _by_alert(messages) -> dict:
    return {m.headers["alert_id"]: m for m in messages}


def test_sql_filters_match_the_brute_force_search_and_carry_the_match_in_a_header(night):
    expected = expected_list(night["alerts"], night["v0"])
    assert len(expected) == 11  # of 16 sources: the inside and exactly-at-radius ones (5 are 10 mas beyond)
    delivered = _by_alert(read_topic(night["cfg"], "filtered.w_full"))
    assert set(delivered) == set(expected)
    for alert_id, message in delivered.items():
        match, = json.loads(message.headers["watch"])
        assert (match["kind"], match["name"], match["version"]) == ("watchlist", "w_agn", 0)
        assert match["source_id"] == expected[alert_id][0]
        assert abs(match["separation_arcsec"] - expected[alert_id][1]) < 1e-5
        assert message.headers["filters"] == "near_agn"


def test_a_filter_naming_a_missing_list_is_one_line_and_the_others_run(night):
    problem = [line for line in night["lines"] if "w_agm" in line]
    assert problem and "typo.sql" in problem[0] and "unknown watchlist 'w_agm' (did you mean 'w_agn'?)" in problem[0]


def test_python_filters_and_subscriptions_use_lists_and_maps(night):
    in_region = expected_region(night["moc"], night["alerts"])
    assert len(in_region) >= 10
    assert set(_by_alert(read_topic(night["cfg"], "filtered.w_py"))) == in_region
    listed = expected_list(night["alerts"], night["v0"])
    subscribed = _by_alert(read_topic(night["cfg"], "filtered.w_sub"))
    assert set(subscribed) == set(listed) | in_region
    for alert_id, message in subscribed.items():
        names = [n for n, inside in (("watchlist:w_agn", alert_id in listed), ("watchmap:w_region",
                                                                               alert_id in in_region)) if inside]
        assert message.headers["filters"] == ",".join(names)
        kinds = sorted(m["kind"] for m in json.loads(message.headers["watch"]))
        assert kinds == sorted(n.split(":")[0] for n in names)


def test_lite_records_carry_the_match_for_confluent_clients(night, registry_url):
    expected = expected_list(night["alerts"], night["v0"])
    values = consume_avro(night["cfg"], registry_url, "w.lite", len(expected))
    assert sorted(v["alert_id"] for v in values) == sorted(int(i) for i in expected)
    for value in values:
        source, separation = expected[str(value["alert_id"])]
        assert value["agn_id"] == source
        match, = value["watch"]
        assert match["source_id"] == source and abs(match["separation_arcsec"] - separation) < 1e-5
        assert match["version"] == 0 and value["matched_filters"] == ["agn_lite"]


def test_the_matches_table_names_the_list_version(night, spark):
    rows = spark.read.format("delta").load(str(night["cfg"].delta_dir / TOPIC / "matches")) \
        .where("broker = 'w_full'").collect()
    assert len(rows) == len(expected_list(night["alerts"], night["v0"]))
    assert {(m["name"], m["version"]) for row in rows for m in row["watch"]} == {("w_agn", 0)}


def test_a_new_list_version_reaches_the_running_stream_and_replays_choose_a_version(night, spark, tmp_path):
    cfg, folder = night["cfg"], night["folder"]
    third = positions(2, 40)
    v1 = watchlist_rows({i: third[i] for i in sorted(third)[::4]}, "qso")
    write_list(folder / "agn_v1.csv", v1)
    lines: list[str] = []
    args = stream_args(cfg, TOPIC, folder / "filters", folder / "brokers.yaml",
                       extra=["--trigger", "1s", "--stop-when-idle", "12", *ARCHIVE_IN_THE_DRIVER])
    stream = threading.Thread(target=lambda: run_saying(lines, lambda: run(args, spark)))
    stream.start()
    deadline = time.time() + 120
    while not any(line.startswith(f"stream '{TOPIC}' running") for line in lines):
        assert time.time() < deadline and stream.is_alive(), lines[-5:]
        time.sleep(0.3)
    (folder / "bad.csv").write_text("id,ra,dec\nx,10,20\nx,11,21\n")
    assert skyfilter(["watchlist", "add", "w_agn", str(folder / "bad.csv"), "--state-dir", str(cfg.state_dir)]) == 2
    watch_command(cfg, "watchlist", "add", "w_agn", str(folder / "agn_v1.csv"))
    produce(cfg, ProduceOptions(topic=TOPIC, visits=1, first_visit=3, alerts_per_visit=40, interval_s=0.0,
                                stamps=False, seed=SEED, night=NIGHT, progress=False))
    stream.join(timeout=180)
    assert not stream.is_alive()
    assert any("reload: watchlist w_agn now version 1 (10 rows)" in line for line in lines), lines
    expected = expected_list(third, v1)
    assert len(expected) == 7
    delivered = {k: m for k, m in _by_alert(read_topic(cfg, "filtered.w_full")).items() if k in third}
    assert set(delivered) == set(expected)
    assert {json.loads(m.headers["watch"])[0]["version"] for m in delivered.values()} == {1}

    # a re-filter reads the versions of the night (v1 was current when visit 3 came) or today's (v2)
    write_list(folder / "agn_v2.csv", night["v0"][:3])
    watch_command(cfg, "watchlist", "add", "w_agn", str(folder / "agn_v2.csv"))
    everything = {**night["alerts"], **third}
    for which, rows in (("night", v1), ("today", night["v0"][:3])):
        table = tmp_path / f"rematches_{which}"
        result = replay_night.run(replay_night.parse_args([
            "--night", NIGHT, "--name", TOPIC, "--filters-dir", str(folder / "filters"), "--brokers",
            str(folder / "brokers.yaml"), "--matches-table", str(table), "--watch", which,
            "--state-dir", str(cfg.state_dir), "--bootstrap", cfg.bootstrap_servers]), spark)
        matched = spark.read.format("delta").load(str(table)).where("broker = 'w_full'").collect()
        assert {r.alert_id for r in matched} == set(expected_list(everything, rows)), which
        assert result["by_broker"]["w_full"] == len(matched)


def test_realtime_mode_matches_lists_and_maps_through_the_filter_workers(night, spark, tmp_path):
    from conftest import stream_process

    cfg = night["cfg"]
    folder = stream_folder(tmp_path / "rt", {"in_region.py": FILTERS["in_region.py"]}, RT_BROKERS)
    job, lines = stream_process(cfg, TOPIC, folder, [
        "--name", "watch-rt", "--trigger", "realtime", "--lane", "delivery", "--stop-when-idle", "10",
        "--starting-offsets", "earliest", "--set", "stream.realtime.checkpoint_interval=10s",
        "--set", "monitoring.port=null"])
    assert job.wait(240) == 0, "\n".join(lines[-20:])
    from skyfilter.watch.store import latest

    version = latest(cfg, "watchlist", "w_agn")
    rows = [(i, ra, dec, r) for i, ra, dec, r in _stored_rows(version)]
    everything = {**night["alerts"], **positions(2, 40)}
    listed = expected_list(everything, rows)
    in_region = expected_region(night["moc"], everything)
    delivered = _by_alert(read_topic(cfg, "filtered.w_rt"))
    assert set(delivered) == set(listed) | in_region
    assert set(_by_alert(read_topic(cfg, "filtered.w_rt_py"))) == in_region
    for alert_id in listed:
        entry = next(m for m in json.loads(delivered[alert_id].headers["watch"]) if m["kind"] == "watchlist")
        assert entry["source_id"] == listed[alert_id][0] and entry["version"] == version.version


def _stored_rows(version):
    from skyfilter.watch.crossmatch import read_index

    index = read_index(version.for_workers())
    return zip(index.source_id.to_pylist(), np.degrees(index.ra), np.degrees(index.dec), index.radius, strict=True)


def test_filters_check_and_test_know_the_lists(night, capsys):
    cfg, filters = night["cfg"], str(night["folder"] / "filters")
    capsys.readouterr()
    assert skyfilter(["filters", "check", filters, "--topic", TOPIC, "--state-dir", str(cfg.state_dir),
                      "--bootstrap", cfg.bootstrap_servers]) == 1
    out = capsys.readouterr().out
    assert "typo.sql:1: unknown watchlist 'w_agm' (did you mean 'w_agn'?)" in out and "near_agn" not in out
    assert skyfilter(["filters", "test", "in_region", "--night", NIGHT, "--name", TOPIC, "--filters-dir", filters,
                      "--state-dir", str(cfg.state_dir), "--bootstrap", cfg.bootstrap_servers]) == 0
    out = capsys.readouterr().out
    records = decode_messages(read_topic(cfg, TOPIC), rubin_schema("10.0"))
    in_region = expected_region(night["moc"], {str(r["diaSourceId"]): (r["diaSource"]["ra"], r["diaSource"]["dec"])
                                               for r in records})
    assert f"matched:        {len(in_region)}" in out
