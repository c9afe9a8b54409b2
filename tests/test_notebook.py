"""The filter-authoring notebook runs headless, end to end, with a real kernel (nbclient)."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from conftest import ROOT
from skyfilter.cli import main


def test_notebook_runs_and_saves_a_filter_that_check_accepts(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SKYFILTER_FILTERS_DIR", str(tmp_path / "filters"))
    monkeypatch.setenv("SKYFILTER_STATE_DIR", str(tmp_path / "state"))
    notebook = nbformat.read(ROOT / "notebooks" / "filter_authoring.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "filter notebook_reliable (sql)" in text and "filter notebook_significant (python)" in text
    assert "filter notebook_near_sources (sql)" in text and "source=src0" in text, "the watchlist section ran"
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1, "light curve and cutouts were plotted"

    saved = tmp_path / "filters" / "notebook_reliable.sql"
    assert saved.exists() and "FROM alerts" in saved.read_text()
    capsys.readouterr()
    assert main(["filters", "check", str(tmp_path / "filters")]) == 0
    assert "1 filter(s) OK, 0 problem(s)" in capsys.readouterr().out
