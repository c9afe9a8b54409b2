"""Benchmarks are not tests: this only checks that each runs on a tiny input and writes its results."""

from __future__ import annotations

import json

from bench.catch_up import main as catch_up
from bench.filter_scaling import main as filter_scaling


def test_filter_scaling_runs_on_a_tiny_night(kafka_cfg, spark, tmp_path, capsys):
    code = filter_scaling(["--alerts", "40", "--alerts-per-visit", "20", "--filters", "1,3", "--brokers", "2",
                           "--repeats", "1",
                           "--no-stamps", "--max-offsets", "20", "--quiet", "--bootstrap", kafka_cfg.bootstrap_servers,
                           "--state-dir", str(tmp_path / "state"), "--results", str(tmp_path / "results")])
    assert code == 0
    result = json.loads((tmp_path / "results" / "filter_scaling_sql.json").read_text())
    assert [(r["filters"], r["brokers"], r["alerts"]) for r in result["results"]] == [(1, 2, 40), (3, 2, 40)]
    assert all(r["batches"] >= 2 and r["alerts_per_s"] > 0 for r in result["results"])
    assert result["machine"]["cores"] and "filter_scaling" in result["command"]
    for suffix in ("csv", "md", "png"):
        assert (tmp_path / "results" / f"filter_scaling_sql.{suffix}").stat().st_size > 0
    assert "| filters | brokers |" in capsys.readouterr().out


def test_catch_up_runs_on_a_tiny_backlog(kafka_cfg, tmp_path, capsys):
    code = catch_up(["--visits", "2", "--alerts-per-visit", "20", "--max-offsets", "15", "--no-stamps", "--quiet",
                     "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir", str(tmp_path / "state"),
                     "--results", str(tmp_path / "results")])
    assert code == 0
    result = json.loads((tmp_path / "results" / "catch_up.json").read_text())
    [row] = result["results"]
    assert row["alerts"] == 40 and row["batches"] >= 3 and row["largest_batch"] <= 15  # bounded batches
    assert row["stream_peak_mb"] > 100 and row["catch_up_s"] > 0
    assert (tmp_path / "results" / "catch_up.png").stat().st_size > 0
    assert "| maxOffsetsPerTrigger |" in capsys.readouterr().out
