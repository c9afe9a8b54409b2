"""`skyfilter filters check`: the stream's own checks, one line per problem, exit 1 when any."""

from __future__ import annotations

from conftest import DATA, ROOT, write_files
from skyfilter.cli import main


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
