"""`skyfilter filters check`: the stream's own checks, one line per problem, exit 1 when any."""

from __future__ import annotations

import re
import shutil

import pytest

from conftest import DATA, ROOT, decode_messages, rewrite_as_ztf_402, stream_args, write_files
from skyfilter.cli import main
from skyfilter.core.config import Config
from skyfilter.jobs.filter_stream import run
from skyfilter.kafka.read_back import read_topic
from skyfilter.producers.command import ProduceOptions, produce
from skyfilter.schemas.avro import avro_files, read_container, rubin_schema
from skyfilter.tools.filter_trial import condition_columns, sample_frame


def test_repository_filters_pass_against_the_simulated_rubin_schema(spark, capsys):
    assert main(["filters", "check", str(ROOT / "filters")]) == 0
    assert "5 filter(s) OK, 0 problem(s)" in capsys.readouterr().out


def test_problems_are_listed_one_per_line_against_a_real_schema(spark, tmp_path, capsys):
    folder = write_files(tmp_path, {
        "bright.sql": "candidate.magpsf < 15.5",
        "typo.sql": "-- a typo on line 2\ncandidate.magpfs < 15",
        "not_boolean.sql": "candidate.magpsf + 1",
        "wrong_field.py": "from skyfilter import alert_filter\n\n\n@alert_filter(columns=['diaSource.snr'])\n"
                          "def wrong_field(snr):\n    return snr > 5\n",
    })
    assert main(["filters", "check", str(folder), "--schema",
                 str(next((DATA / "ztf-3.3").glob("*.avro")))]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"{folder}/typo.sql:2: unknown column 'candidate.magpfs' (did you mean 'candidate.magpsf'?)" in lines
    assert f"{folder}/not_boolean.sql:1: condition is of type double, not boolean" in lines
    assert f"{folder}/wrong_field.py:4: unknown column 'diaSource.snr'" in lines
    assert lines[-1].startswith("1 filter(s) OK, 3 problem(s)")


def test_filters_check_honours_filters_dir_and_refuses_an_empty_folder(spark, tmp_path, capsys):
    folder = write_files(tmp_path / "mine", {"only.sql": "diaSource.snr > 5"})
    assert main(["filters", "check", "--filters-dir", str(folder)]) == 0
    assert f"1 filter(s) OK, 0 problem(s) in {folder}" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["filters", "check", str(tmp_path / "empty")]) == 2
    assert f"no filters in {tmp_path / 'empty'}" in capsys.readouterr().err


def test_filters_test_reports_a_python_filter_that_raises_or_returns_the_wrong_length(spark, tmp_path, capsys):
    folder = write_files(tmp_path, {
        "boom.py": "from skyfilter import alert_filter\n\n\n@alert_filter(columns=['diaSource.snr'])\n"
                   "def boom(snr):\n    raise ValueError('no luck')\n",
        "short.py": "from skyfilter import alert_filter\n\n\n@alert_filter(columns=['diaSource.snr'])\n"
                    "def short(snr):\n    return (snr > 5).iloc[:0]\n",
    })
    for name, says in (("boom", "ValueError: no luck"), ("short", "0 values for 1")):
        assert main(["filters", "test", name, "--filters-dir", str(folder), "--sample", str(DATA / "lsst-v10")]) == 1
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith(f"error: {folder}/{name}.py:4: ") and says in first and "quarantine" in first, first


def _report(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("  "))


def test_filters_test_on_real_rubin_sample_files(spark, capsys):
    sample = DATA / "lsst-v10"
    assert main(["filters", "test", "reliable_red", "--sample", str(sample)]) == 0
    out = capsys.readouterr().out
    records = [r.record for path in avro_files([sample]) for r in read_container(path)[1]]
    expected = sorted(str(r["diaSourceId"]) for r in records
                      if r["diaSource"]["band"] in ("i", "z", "y") and r["diaSource"]["reliability"] > 0.9
                      and r["diaSource"]["snr"] > 10)
    report = _report(out)
    assert int(report["alerts scanned"]) == len(records) == 7
    assert int(report["matched"]) == len(expected) > 0
    assert float(report["match rate"].strip(" %")) == pytest.approx(100 * len(expected) / 7, abs=0.01)
    p50, p90, p99 = (float(x) for x in re.findall(r"p\d\d ([0-9.]+) ms", report["time per alert"]))
    assert 0 < p50 <= p90 <= p99
    shown = re.findall(r"^  alert_id=(\d+), diaSource.band=", out, re.M)
    assert shown == expected[:5]


def test_filters_test_on_an_archived_night_times_python_alert_by_alert(kafka_cfg, spark, tmp_path, capsys):
    topic, night = "trial.alerts", "2026-11-05"
    write_files(tmp_path / "filters", {"negative.py": "from skyfilter import alert_filter\n\n\n"
                                                      "@alert_filter(columns=['diaSource.psfFlux', 'diaSource.snr'])\n"
                                                      "def negative(flux, snr):\n    return flux < 0\n"})
    (tmp_path / "brokers.yaml").write_text("brokers:\n  trial_b:\n    filters: [negative]\n")
    produce(kafka_cfg, ProduceOptions(topic=topic, visits=2, alerts_per_visit=30, interval_s=0.0, stamps=False,
                                      seed=5, night=night, progress=False))
    run(stream_args(kafka_cfg, topic, tmp_path / "filters", tmp_path / "brokers.yaml"), spark)
    records = decode_messages(read_topic(kafka_cfg, topic), rubin_schema("10.0"))
    expected = {str(r["diaSourceId"]) for r in records if r["diaSource"]["psfFlux"] < 0}
    capsys.readouterr()
    assert main(["filters", "test", "negative", "--night", night, "--name", topic, "--limit", "50", "--show", "3",
                 "--filters-dir", str(tmp_path / "filters"), "--state-dir", str(kafka_cfg.state_dir)]) == 0
    out = capsys.readouterr().out
    report = _report(out)
    assert int(report["alerts scanned"]) == 50
    assert "Python, timed alert by alert" in report["time per alert"]
    shown = re.findall(r"^  alert_id=(\d+), diaSource.psfFlux=(\S+), diaSource.snr=", out, re.M)
    assert len(shown) == min(3, int(report["matched"])) and all(float(flux) < 0 for _, flux in shown)
    assert {i for i, _ in shown} <= expected


def test_filters_test_errors_are_one_line(spark, tmp_path, capsys):
    assert main(["filters", "test", "nope", "--sample", str(DATA / "lsst-v10")]) == 2
    assert "no filter 'nope' in" in capsys.readouterr().err


def test_filters_test_reads_sample_files_of_several_schema_versions(spark, tmp_path, capsys):
    """Half the real ZTF 3.3 alerts rewritten as ZTF 4.02: one trial over both, as a topic carrying both is read."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    records = []
    for index, path in enumerate(avro_files([DATA / "ztf-3.3"])[:10]):
        if index % 2:
            records.append(rewrite_as_ztf_402(path, folder / path.name))
        else:
            records.append(next(read_container(path)[1]).record)
            shutil.copy(path, folder / path.name)
    write_files(tmp_path / "filters", {"bright.sql": "candidate.magpsf < 18.5"})
    assert main(["filters", "test", "bright", "--filters-dir", str(tmp_path / "filters"),
                 "--sample", str(folder)]) == 0
    report = _report(capsys.readouterr().out)
    assert int(report["alerts scanned"]) == 10
    assert int(report["matched"]) == sum(r["candidate"]["magpsf"] < 18.5 for r in records)


def test_sql_timing_copies_only_the_columns_the_condition_reads(spark):
    """The timing pass copies the sample 10,000 times or more: whole Rubin alerts would fill the driver's heap."""
    alerts, _ = sample_frame(spark, Config.load(ROOT / "conf" / "local.yaml"), [DATA / "lsst-v10"])
    condition = "diaSource.snr > 10 AND exists(prvDiaSources, s -> s.snr > 5) AND night IS NOT NULL"
    assert condition_columns(alerts, condition) == [c for c in alerts.columns
                                                    if c in ("diaSource", "prvDiaSources", "night")]
    assert "diaObject" in alerts.columns and "cutoutScience" in alerts.columns
