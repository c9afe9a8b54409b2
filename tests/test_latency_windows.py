"""The benchmark's windows of a run: the first seconds, the steady minutes and the boundary minute apart."""

import os

from bench.latency_windows import BOUNDARY, EARLY, FIRST, STEADY, checkpoint_commits, lane_ratio_notes, window_rows


def test_a_run_splits_into_its_first_seconds_its_minutes_and_its_boundary_minute():
    # 10 alerts a second for 420 s: the first 10 s slow, a spike just after the commit at 305 s
    timeline = [(i / 10, 3000.0 if i < 100 else 900.0 if 3050 <= i < 3060 else 20.0) for i in range(4200)]
    rows = window_rows("both", timeline, 420.0, [305.2])
    by_window = {row["window"]: row for row in rows}
    assert [r["window"] for r in rows[:4]] == ["0-10 s", "10-30 s", "30-60 s", "60-120 s"]
    assert (by_window["0-10 s"]["kind"], by_window["0-10 s"]["n"], by_window["0-10 s"]["p99_ms"]) == (FIRST, 100, 3000)
    assert (by_window["10-30 s"]["kind"], by_window["10-30 s"]["max_ms"]) == (EARLY, 20)
    assert by_window["300-360 s"]["kind"] == BOUNDARY and by_window["300-360 s"]["max_ms"] == 900
    assert by_window["360-420 s"]["kind"] == STEADY
    steady, boundary = by_window["steady minutes (6)"], by_window["boundary minutes (1)"]
    assert steady["n"] == 3300 and steady["max_ms"] == 20 and steady["worst_minute_p99_ms"] == 20
    assert boundary["n"] == 600 and boundary["p99_ms"] == 900


def test_a_short_run_has_no_minutes_and_a_ratio_per_kind_of_window():
    timeline = [(i / 10, 100.0 if i < 50 else 10.0) for i in range(150)]
    both = window_rows("both", timeline, 15.0, [])
    assert [r["window"] for r in both] == ["0-10 s", "10-15 s"]
    alone = window_rows("alone", [(s, ms / 2) for s, ms in timeline], 15.0, [])
    notes = lane_ratio_notes(both + alone, {"alone"})
    assert notes == ["both against delivery alone, 0-10 s: p99 100 against 50 ms (2.00x)",
                     "both against delivery alone, 10-15 s: p99 10 against 5 ms (2.00x)"]


def test_boundaries_are_the_commits_after_the_run_began(tmp_path):
    commits = tmp_path / "commits"
    commits.mkdir()
    for batch, at in ((0, 900.0), (1, 1010.0), (2, 1310.0)):
        (commits / str(batch)).write_text("v1")
        os.utime(commits / str(batch), (at, at))
    (commits / ".1.crc").write_text("")
    assert checkpoint_commits(tmp_path, 1000.0) == [10.0, 310.0]
    assert checkpoint_commits(tmp_path / "none", 1000.0) == []
