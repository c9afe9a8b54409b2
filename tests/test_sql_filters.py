"""SQL filters, full form: Spark's parser and analyzer decide what a filter is and refuse the rest."""

from __future__ import annotations

import pytest

from conftest import ROOT, write_files
from skyfilter.core.config import Config
from skyfilter.tools.filter_tools import check_filters, cost_notes, schema_for_check

REFUSED = {
    "several_statements.sql": ("SELECT diaSource.ra FROM alerts WHERE diaSource.snr > 5;\nDROP TABLE alerts", 2,
                               "several statements: a filter is one condition or one SELECT"),
    "condition_twice.sql": ("diaSource.snr > 5; diaSource.snr < 9", 1,
                            "several statements: a filter is one condition or one SELECT"),
    "dangling.sql": ("diaSource.snr > 5\nAND", 2, "SQL syntax error: unexpected 'AND' after the condition"),
    "ddl.sql": ("DROP TABLE alerts", 1,
                "DROP TABLE statement: a filter only reads alerts (DDL and DML are not allowed)"),
    "dml.sql": ("INSERT INTO alerts SELECT * FROM alerts", 1,
                "INSERT INTO statement: a filter only reads alerts (DDL and DML are not allowed)"),
    "join.sql": ("SELECT a.alert_id FROM alerts a JOIN alerts b ON a.alert_id = b.alert_id\nWHERE a.diaSource.snr > 5",
                 1, "joins are not allowed: a filter looks at one alert at a time"),
    "subquery.sql": ("SELECT alert_id FROM alerts\nWHERE diaSource.snr > (SELECT avg(diaSource.snr) FROM alerts)", 1,
                     "subqueries are not allowed: a filter looks at one alert at a time"),
    "from_subquery.sql": ("SELECT alert_id FROM (SELECT * FROM alerts) WHERE diaSource.snr > 5", 1,
                          "subqueries are not allowed: a filter looks at one alert at a time"),
    "aggregate.sql": ("SELECT count(*) FROM alerts WHERE diaSource.snr > 5", 1,
                      "aggregates (GROUP BY, count, avg...) are not allowed: a filter looks at one alert at a time"),
    "group_by.sql": ("SELECT diaSource.band, max(diaSource.snr) FROM alerts WHERE diaSource.snr > 5 "
                     "GROUP BY diaSource.band", 1,
                     "aggregates (GROUP BY, count, avg...) are not allowed: a filter looks at one alert at a time"),
    "window.sql": ("SELECT alert_id, rank() OVER (ORDER BY diaSource.snr) AS r FROM alerts WHERE diaSource.snr > 5", 1,
                   "window functions (OVER ...) are not allowed: a filter looks at one alert at a time"),
    "random.sql": ("SELECT alert_id FROM alerts\nWHERE rand() < 0.1", 2,
                   "rand() is not deterministic: a replayed night would match differently "
                   "(use the alert's own times, e.g. its MJD columns)"),
    "clock.sql": ("-- recent ones\ndiaSource.midpointMjdTai > unix_seconds(now()) / 86400.0 + 40587 - 1", 2,
                  "now() is not deterministic: a replayed night would match differently "
                  "(use the alert's own times, e.g. its MJD columns)"),
    "order_limit.sql": ("SELECT alert_id FROM alerts WHERE diaSource.snr > 5 ORDER BY diaSource.snr LIMIT 10", 1,
                        "LIMIT is not allowed: per-visit limits are the broker's max_alerts_per_visit"),
    "other_table.sql": ("SELECT alert_id FROM visits WHERE snr > 5", 1,
                        "unknown table `visits`: a filter reads FROM alerts only"),
    "star.sql": ("SELECT * FROM alerts WHERE diaSource.snr > 5", 1,
                 "SELECT * is the whole alert: name the columns (or use format full/nocutouts)"),
    "no_where.sql": ("SELECT alert_id FROM alerts", 1,
                     "write SELECT <columns> FROM alerts WHERE <condition> "
                     "(the WHERE condition is what the filter keeps)"),
    "typo.sql": ("SELECT alert_id,\n  diaSource.snrr\nFROM alerts WHERE diaSource.snr > 5", 2,
                 "unknown column 'diaSource.snrr' (did you mean 'diaSource.snr'?)"),
    "same_name.sql": ("SELECT diaSource.ra, diaObject.ra FROM alerts WHERE diaSource.snr > 5", 1,
                      "two selected columns are named 'ra': give one an alias with AS"),
}


@pytest.fixture(scope="module")
def rubin_schema_json():
    return schema_for_check(Config.load(), None, None)[1]


def test_each_refused_construct_gets_its_file_line_and_reason(spark, tmp_path, rubin_schema_json):
    folder = write_files(tmp_path, {name: text for name, (text, _, _) in REFUSED.items()})
    valid, problems = check_filters(Config.load(), folder, rubin_schema_json)
    assert valid == []
    expected = {f"{folder}/{name}:{line}: {reason}" for name, (_, line, reason) in REFUSED.items()}
    assert set(problems) == expected, sorted(set(problems) ^ expected)


def test_type_errors_name_the_problem(spark, tmp_path, rubin_schema_json):
    folder = write_files(tmp_path, {"types.sql": "SELECT alert_id FROM alerts\nWHERE diaSource.snr > 5 AND "
                                                 "diaSource.ra",
                                    "array.sql": "array_contains(diaSource.snr, 1)"})
    _, problems = check_filters(Config.load(), folder, rubin_schema_json)
    assert len(problems) == 2, problems
    assert all(": type error: " in p for p in problems), problems
    assert {p.split(": type error")[0] for p in problems} == {f"{folder}/types.sql:2", f"{folder}/array.sql:1"}


def test_full_form_keeps_condition_and_selected_columns(spark, tmp_path, rubin_schema_json):
    folder = write_files(tmp_path, {
        "lite.sql": "-- bright and reliable\nSELECT alert_id, diaSource.ra, diaSource.dec AS decl,\n"
                    "       diaSource.psfFlux / diaSource.psfFluxErr AS snr_psf\n"
                    "FROM alerts AS a\nWHERE diaSource.snr > 50\n  AND diaSource.reliability > 0.5;\n",
        "bare.sql": "diaSource.snr > 50",
    })
    valid, problems = check_filters(Config.load(), folder, rubin_schema_json)
    assert problems == []
    by_name = {s.name: s for s in valid}
    assert by_name["lite"].condition == "diaSource.snr > 50\n  AND diaSource.reliability > 0.5"
    assert by_name["lite"].selects == (("alert_id", "alert_id"), ("ra", "diaSource.ra"),
                                       ("decl", "diaSource.dec"),
                                       ("snr_psf", "diaSource.psfFlux / diaSource.psfFluxErr"))
    assert by_name["bare"].condition == "diaSource.snr > 50" and by_name["bare"].selects == ()


def test_a_python_filter_naming_a_whole_history_gets_a_cost_note(spark, tmp_path, rubin_schema_json):
    decorator = "from skyfilter import alert_filter\n\n\n@alert_filter(columns={columns})\n"
    folder = write_files(tmp_path, {
        "whole.py": decorator.format(columns='["diaSource.psfFlux", "prvDiaSources", "diaSource"]')
        + "def whole(flux, history, source):\n    return flux > 0\n",
        "fields.py": decorator.format(columns='["diaSource.psfFlux", "prvDiaSources.psfFlux"]')
        + "def fields(flux, history_flux):\n    return flux > 0\n",
    })
    valid, problems = check_filters(Config.load(), folder, rubin_schema_json)
    assert problems == [] and len(valid) == 2
    notes = cost_notes(Config.load(), valid, rubin_schema_json)
    assert [note.split(": note: ")[0] for note in notes] == [f"{folder}/whole.py:4"] * 2, notes
    assert "'prvDiaSources' hands the filter all" in notes[0] and "of each entry of the array" in notes[0]
    assert "'diaSource' hands the filter all" in notes[1] and "of the record" in notes[1]
    shipped, _ = check_filters(Config.load(), ROOT / "filters", rubin_schema_json)
    assert cost_notes(Config.load(), shipped, rubin_schema_json) == []
