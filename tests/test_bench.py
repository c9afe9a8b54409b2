"""Benchmarks are not tests: this only checks that each runs on a tiny input and writes its results.

Every experiment runs against the session's Kafka and SparkSession, writes
JSON, CSV, Markdown and a PNG, states its machine and command, reports peak
memory, and appends one row to its ``bench_runs`` Delta table.  The archive's
triggers are short here, and where the archive's own process is not what is
measured (the broker load measures it) it runs in the stream's driver
(``conftest.ARCHIVE_IN_THE_DRIVER``): each stream then starts one JVM, not two.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest

from bench.alert_cache import CachedSource, cached_visits
from bench.broker_load import main as broker_load
from bench.cap_ledger import main as cap_ledger
from bench.catch_up import main as catch_up
from bench.filter_scaling import main as filter_scaling
from bench.grid import main as grid
from bench.metrics_scrape import freshness
from bench.producer_rate import main as producer_rate
from bench.side_by_side import main as side_by_side
from bench.stages import main as stages
from bench.sustained import check_disk, retention_settings, scaled_cap
from bench.sustained import main as sustained
from bench.trigger_sweep import main as trigger_sweep
from bench.user_path import after_restart
from bench.user_path import main as user_path
from bench.visit_burst import main as visit_burst
from bench.watchlists import main as watchlists
from conftest import ARCHIVE_IN_THE_DRIVER, DATA
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.topics import admin_client
from skyfilter.schemas.avro import rubin_schema
from skyfilter.schemas.wire import HEADER_SIZE


def _run(main, name: str, options: list[str], kafka_cfg, tmp_path: Path, capsys) -> dict:
    """Run one experiment; check every result file, the printed table and the bench_runs row; return its JSON."""
    results, state = tmp_path / "results", tmp_path / "state"
    code = main([*options, "--quiet", "--bootstrap", kafka_cfg.bootstrap_servers, "--state-dir", str(state),
                 "--results", str(results)])
    assert code == 0
    for suffix in ("csv", "md", "png"):
        assert (results / f"{name}.{suffix}").stat().st_size > 0
    result = json.loads((results / f"{name}.json").read_text())
    assert result["machine"]["cores"] and result["machine"]["spark"] and f"bench.{name}" in result["command"]
    assert result["peak_rss_mb"] and all(mb >= 0 for mb in result["peak_rss_mb"].values())
    assert "Peak memory (RSS)" in (results / f"{name}.md").read_text()
    if result["peak_rss_mb"].get("driver"):
        assert "driver: java" in result["peak_breakdown"]
    assert "| " in capsys.readouterr().out
    return result


def _recorded_runs(spark, tmp_path: Path) -> list:
    return spark.read.format("delta").load(str(tmp_path / "state" / "bench_runs")).collect()


def test_filter_scaling_runs_on_a_tiny_night(kafka_cfg, spark, tmp_path, capsys):
    result = _run(filter_scaling, "filter_scaling",
                  ["--alerts", "40", "--alerts-per-visit", "20", "--filters", "2", "--kinds", "sql,python",
                   "--brokers", "2", "--repeats", "1", "--no-stamps", "--max-offsets", "20"], kafka_cfg, tmp_path,
                  capsys)
    assert [(r["kind"], r["filters"], r["alerts"]) for r in result["results"]] == [("sql", 2, 40), ("python", 2, 40)]
    assert all(r["batches"] >= 2 and r["alerts_per_s"] > 0 for r in result["results"])
    [row] = _recorded_runs(spark, tmp_path)
    assert row.benchmark == "filter_scaling" and len(json.loads(row.results)) == 2 and row.peak_rss_mb["driver"] > 0


def test_visit_burst_times_one_visit_to_its_last_delivery(kafka_cfg, spark, tmp_path, capsys):
    result = _run(visit_burst, "visit_burst", ["--alerts", "30", "--warm-up", "10", "--filters", "3", "--brokers", "2",
                                               "--producers", "2", "--no-stamps", "--runs", "0/full/2",
                                               "--python-filters", "1", "--capped-every", "1",
                                               "--cuts", "loose", *ARCHIVE_IN_THE_DRIVER],
                  kafka_cfg, tmp_path, capsys)
    [row] = result["results"]
    assert row["alerts"] == 30 and row["brokers"] == 2 and row["delivery_batches"] >= 1
    assert 0 < row["messages"] <= 2 * 2  # 2 brokers, at most 2 alerts of the visit each
    # the archive runs beside delivery, not after it: the visit may be archived before its last match is sent
    assert 0 < row["first_match_s"] <= row["last_match_s"] and row["archived_s"] > 0


def test_trigger_sweep_reports_latency_and_archive_lag_per_trigger(kafka_cfg, spark, tmp_path, capsys):
    """Measured after a warm-up visit through the same stream: its alerts are in neither the figures nor the lag."""
    result = _run(trigger_sweep, "trigger_sweep",
                  ["--triggers", "1", "--warm-up", "--visits", "2", "--alerts-per-visit", "10",
                   "--visit-seconds", "1", "--filters", "2", "--brokers", "2", "--producers", "1", "--no-stamps",
                   *ARCHIVE_IN_THE_DRIVER], kafka_cfg, tmp_path, capsys)
    [row] = result["results"]
    assert row["trigger"] == "1s" and row["alerts"] == 20 and row["messages"] > 0
    assert 0 < row["p50_s"] <= row["p95_s"] <= row["p99_s"] <= row["max_s"]
    assert row["archive_max_lag"] >= 10 and isinstance(row["archive_lag_growth_per_s"], float)
    cores = result["machine"]["cores"]
    assert row["cpu_driver_s"] > 0 and row["cpu_archive_s"] == 0, "both lanes' CPU in the driver (broker load: apart)"
    assert row["cpu_driver_s"] + row["cpu_archive_s"] + row["cpu_kafka_s"] <= cores * row["cpu_window_s"] + 1


def test_watchlists_compares_the_stream_with_and_without_a_list(kafka_cfg, spark, tmp_path, capsys):
    result = _run(watchlists, "watchlists",
                  ["--sizes", "0,500", "--trigger", "1", "--no-warm-up", "--visits", "1", "--alerts-per-visit", "200",
                   "--visit-seconds", "1", "--filters", "2", "--brokers", "2", "--producers", "1", "--no-stamps",
                   *ARCHIVE_IN_THE_DRIVER], kafka_cfg, tmp_path, capsys)
    none, listed = result["results"]
    assert (none["sources"], listed["sources"]) == (0, 500) and none["p99_vs_none"] == 1.0
    assert listed["match_rate"] == 0.01, "a source beside every 100th alert, the rest 2 arcsec dots over the sky"
    assert listed["load_s"] > 0 and listed["match_us_per_alert"] > 0 and listed["driver_peak_mb"] > 0
    assert 0 < listed["p50_s"] <= listed["p99_s"]


def test_broker_load_measures_both_lanes_against_delivery_alone(kafka_cfg, spark, tmp_path, capsys):
    result = _run(broker_load, "broker_load",
                  ["--modes", "realtime/both,realtime/delivery", "--seconds", "3", "--rate", "10", "--filters", "6",
                   "--python-filters", "2", "--brokers", "3", "--capped-every", "3", "--cap", "2", "--producers", "1",
                   "--cached-visits", "2", "--no-stamps", "--cuts", "loose", "--set", "archive.trigger=1s",
                   "--set", "topics.alerts_partitions=1", "--set", "stream.tasks=1",
                   "--set", "archive.log_trigger=1s", "--set", "stream.realtime.checkpoint_interval=10s"],
                  kafka_cfg, tmp_path, capsys)
    both, alone = result["results"]
    assert (both["mode"], alone["mode"]) == ("realtime-both", "realtime-delivery")
    for row in (both, alone):
        assert row["alerts"] == 30 and row["messages"] > 0 and row["python_messages"] > 0
        assert 0 < row["p50_s"] <= row["p95_s"] <= row["p99_s"] <= row["p999_s"] <= row["max_s"]
    assert both["archive_max_lag"] >= 10 and alone["archive_max_lag"] is None
    assert both["cpu_archive_s"] > 0 and alone["cpu_archive_s"] == 0, "the archive runs in its own process, or not"
    notes = (tmp_path / "results" / "broker_load.md").read_text()
    assert "the delivery-only run" in notes and "Python" in notes


def test_user_path_starts_the_job_with_spark_submit_on_a_busy_topic_and_restarts_it(kafka_cfg, tmp_path, capsys):
    result = _run(user_path, "user_path",
                  ["--variants", "lean:archive.writer=delta-rs+archive.process=same", "--seconds", "4", "--rate", "10",
                   "--backlog-visits", "1", "--restart-at", "2", "--filters", "4", "--python-filters", "1",
                   "--brokers", "2", "--producers", "1", "--cached-visits", "2", "--no-stamps", "--cuts", "loose",
                   "--kafka-warm-up", "1",
                   "--set", "archive.trigger=1s", "--set", "archive.log_trigger=1s", "--scrape-every", "0.5"],
                  kafka_cfg, tmp_path, capsys)
    [row] = result["results"]
    assert row["metrics_scrapes"] >= 2 and row["metrics_delivered_stale_max_s"] is not None, \
        "the job's endpoint was scraped while it sent, until the kill"
    assert (row["variant"], row["settings"], row["alerts"]) == \
        ("lean", "archive.writer=delta-rs archive.process=same", 40)  # one JVM per start: a quicker smoke test
    assert row["messages"] > 0 and 0 < row["p50_s"] <= row["p99_s"] <= row["max_s"]
    assert row["restarted_at_s"] >= 2 and row["exit_code"] == 0, "killed, started again, stopped cleanly"
    assert row["running_again_s"] > row["restarted_at_s"] and row["backlog_cleared_s"] is not None
    assert row["recovered_p99_s"] is None, "every alert was sent before the restarted job ran: none to judge by"
    assert row["archived_s_after_sending"] is not None, "every alert sent was archived"
    windows = json.loads((tmp_path / "results" / "user_path_windows.json").read_text())["results"]
    assert windows[0]["window"] == "0-4 s" and windows[0]["n"] == row["messages"], "every message in its window"
    log = next((tmp_path / "state" / "run").glob("user_path.lean.log")).read_text()
    assert log.count("$ spark-submit pipelines/filter_stream.py") == 2 and "--name path_" in log


def test_after_restart_splits_the_backlog_from_what_came_after():
    timeline = [(1.0, 50.0), (40.0, 30_000.0), (50.0, 21_000.0), (70.0, 100.0), (140.0, 150.0), (150.0, 300.0)]
    assert after_restart(timeline, 60.0) == \
        {"running_again_s": 60.0, "backlog_cleared_s": 11.0, "recovered_p99_s": 0.3}
    assert after_restart(timeline, None)["backlog_cleared_s"] is None


def test_sustained_follows_both_lanes_lag_and_memory(kafka_cfg, spark, tmp_path, capsys):
    result = _run(sustained, "sustained",
                  ["--minutes", "0.05", "--visit-seconds", "1", "--alerts-per-visit", "10", "--filters", "2",
                   "--brokers", "2", "--producers", "1", "--cached-visits", "2", "--no-stamps",
                   *ARCHIVE_IN_THE_DRIVER], kafka_cfg, tmp_path, capsys)
    [main] = result["results"]
    assert (main["alerts_per_visit"], main["visits"], main["alerts"]) == (10, 3, 30)
    assert main["delivery_max_lag"] >= 10 and main["archive_max_lag"] >= 10
    assert main["driver_peak_mb"] > 100 and isinstance(main["kept_up"], bool)
    assert not list((tmp_path / "state" / "delta").glob("sustained_*")), "a measured night's tables are deleted"
    assert not [t for t in admin_client(kafka_cfg).list_topics(timeout=10).topics if t.startswith("bench.sustained.")]


def test_grid_times_producing_and_consuming_per_cell(kafka_cfg, spark, tmp_path, capsys):
    result = _run(grid, "grid", ["--producers", "1,2", "--partitions", "2", "--stamp-modes", "off",
                                 "--alerts-per-visit", "20", "--visits", "2", "--no-producer-variants"],
                  kafka_cfg, tmp_path, capsys)
    cells = [(r["producers"], r["partitions"]) for r in result["results"]]
    assert cells == [(1, 2), (2, 2)]
    for row in result["results"]:
        assert 0 < row["produce_min_s"] <= row["produce_mean_s"] <= row["produce_max_s"]
        assert 0 < row["consume_min_s"] <= row["consume_mean_s"] <= row["consume_max_s"]


def test_side_by_side_compares_designs_on_one_topic(kafka_cfg, spark, tmp_path, capsys):
    result = _run(side_by_side, "side_by_side", ["--alerts", "30", "--filters", "3", "--brokers", "2",
                                                 "--no-stamps", "--repeats", "2"], kafka_cfg, tmp_path, capsys)
    designs = result["results"]
    assert len(designs) == 6 and designs[0]["x_raw"] == 1.0 and designs[3]["x_spark"] == 1.0
    assert [d["alerts"] for d in designs] == [30] * 6  # each per-filter process read every alert
    assert designs[2]["processes"] == 3 and all(d["alerts_per_s"] > 0 for d in designs)
    assert all(lane["seconds"] <= lane["first_s"] for lane in designs[4:])  # the best of two fresh streams


def test_producer_rate_sends_simulated_and_real_alerts(kafka_cfg, spark, tmp_path, capsys):
    result = _run(producer_rate, "producer_rate", ["--alerts", "30", "--no-stamps", "--real",
                                                   str(DATA / "lsst-v10")], kafka_cfg, tmp_path, capsys)
    assert [r["sent"] for r in result["results"]] == [30, 30, 30, 30]
    assert all(r["failed"] == 0 and r["alerts_per_s"] > 0 for r in result["results"])
    assert result["results"][2]["kb_per_alert"] > 100  # real Rubin alerts carry their cutouts


def test_catch_up_runs_on_a_tiny_backlog(kafka_cfg, tmp_path, capsys):
    result = _run(catch_up, "catch_up", ["--visits", "2", "--alerts-per-visit", "10", "--max-offsets", "12",
                                         "--no-stamps"], kafka_cfg, tmp_path, capsys)
    [row] = result["results"]
    assert row["alerts"] == 20 and row["batches"] >= 2 and row["largest_batch"] <= 12  # bounded archive batches
    assert row["stream_peak_mb"] > 100 and row["catch_up_s"] > 0


def test_stages_times_each_part_of_the_hot_path(kafka_cfg, spark, tmp_path, capsys):
    result = _run(stages, "stages", ["--alerts", "20", "--repeats", "1", "--no-stamps"], kafka_cfg, tmp_path, capsys)
    assert len(result["results"]) == 10 and all(r["best_s"] > 0 for r in result["results"])


def test_cap_ledger_times_admissions_in_the_jvm_and_over_tcp(kafka_cfg, spark, tmp_path, capsys):
    result = _run(cap_ledger, "cap_ledger", ["--alerts", "300", "--repeats", "1"], kafka_cfg, tmp_path, capsys)
    in_jvm, admitted, refused = result["results"]
    assert in_jvm["mean_us"] >= 0 and 0 < refused["p50_us"] <= refused["p99_us"]
    assert 0 < admitted["p50_us"] <= admitted["p99_us"] and admitted["alerts"] == 300


def test_docs_tables_and_plots_are_refreshed_from_the_results(tmp_path):
    from bench.report import update_docs

    results = tmp_path / "results"
    results.mkdir()
    (results / "demo.md").write_text("## Title\n\n| a |\n|---|\n| 1 |\n\nMachine: 2 cores.\n\n"
                                     "Command: `x`\n\nPeak memory (RSS): driver 5 MB.\n\n* a note\n")
    (results / "demo.png").write_bytes(b"png")
    page = tmp_path / "performance.md"
    page.write_text("intro\n<!-- bench:demo -->\nold\n<!-- /bench:demo -->\n<!-- bench:gone -->\nkeep\n"
                    "<!-- /bench:gone -->\nend\n")
    assert update_docs(page, results) == ["demo"]
    assert page.read_text() == ("intro\n<!-- bench:demo -->\n| a |\n|---|\n| 1 |\n\nMachine: 2 cores.\n\n"
                                "Command: `x`\n\nPeak memory (RSS): driver 5 MB.\n<!-- /bench:demo -->\n"
                                "<!-- bench:gone -->\nkeep\n<!-- /bench:gone -->\nend\n")
    assert (tmp_path / "img" / "demo.png").read_bytes() == b"png"


def test_lag_growth_is_flat_when_kept_up_and_the_deficit_when_not():
    from bench.lags import lag_growth

    steady = [{"t": t, "lag": 100 if t % 2 else 0} for t in range(0, 41)]
    behind = [{"t": t, "lag": 30 * t} for t in range(0, 41)]
    assert abs(lag_growth(steady, 40)) < 1.0
    assert lag_growth(behind, 40) == 30.0


def test_a_cycled_cached_visit_is_moved_to_the_visit_it_is_sent_as(tmp_path):
    schema = rubin_schema("10.0")
    cache = cached_visits(tmp_path, schema, 2, 3, stamps=False, progress=False)
    source = CachedSource(cache, 5, schema)
    parsed = fastavro.parse_schema(schema)

    def sent(visit: int) -> list[tuple[bytes, dict]]:
        return [(key, fastavro.schemaless_reader(io.BytesIO(value[HEADER_SIZE:]), parsed))
                for key, value in source.messages(visit, 0, 1)]

    first, fifth = sent(0), sent(4)  # visit 4 replays cached visit 0, four visits later
    for (key, alert), (moved_key, moved) in zip(first, fifth, strict=True):
        assert moved["diaSource"]["visit"] == alert["diaSource"]["visit"] + 4
        assert moved["diaSourceId"] == moved["diaSource"]["diaSourceId"] == alert["diaSourceId"] + 4 * 100000
        assert moved_key == str(moved["diaSourceId"]).encode() and key == str(alert["diaSourceId"]).encode()
        assert {**moved, "diaSourceId": 0, "diaSource": {**moved["diaSource"], "visit": 0, "diaSourceId": 0}} == \
               {**alert, "diaSourceId": 0, "diaSource": {**alert["diaSource"], "visit": 0, "diaSourceId": 0}}
    assert [a["diaSource"]["visit"] for _, a in sent(1)] == [a["diaSource"]["visit"] - 2 for _, a in sent(3)]


def test_a_time_scaled_night_scales_the_per_visit_cap_with_the_visit():
    assert [scaled_cap(20, 10), scaled_cap(20, 1), scaled_cap(1, 10), scaled_cap(None, 10)] == [2, 20, 1, None]


def test_a_long_night_keeps_its_input_for_the_retention_asked_and_is_refused_when_the_disk_is_too_small(tmp_path):
    assert retention_settings(None) == {}
    assert retention_settings(4) == {"retention.ms": "240000", "segment.ms": "60000"}
    cache = cached_visits(tmp_path, rubin_schema("10.0"), 1, 4, stamps=False, progress=False)
    check_disk(tmp_path, cache, 1000, 3, 256.0)  # a few MB: fits
    with pytest.raises(SkyfilterError, match=r"GB are free: shorten it, or keep less in Kafka"):
        check_disk(tmp_path, cache, 10**12, None, 256.0)


def test_metrics_freshness_sets_each_scrape_against_what_was_delivered_by_then():
    delivered_at = [10.0, 11.0, 12.0, 20.0]
    scrapes = [{"at": 12.5, "delivered": 3, "appended": 512, "read": 256, "lag_s": 0.4},   # all counted
               {"at": 21.0, "delivered": 3, "appended": 1024, "read": 1024, "lag_s": 0.0},  # 20.0 not yet: 1 s old
               {"at": 99.0, "delivered": 0, "appended": 0, "read": 0, "lag_s": 9.0}]       # after sending: left out
    assert freshness(scrapes, delivered_at, 256, since=10.0, until=30.0) == {
        "scrapes": 2, "delivered_stale_max_s": 1.0, "read_behind_max_s": 1.0, "lag_shown_max_s": 0.4}
    assert freshness([], delivered_at, 256, 0, 1)["delivered_stale_max_s"] is None
