"""Benchmarks are not tests: this only checks that each runs on a tiny input and writes its results."""

from __future__ import annotations

import json

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
