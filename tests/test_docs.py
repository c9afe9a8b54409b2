"""The documentation: a short README pointing into docs/, and a docs site that builds with no broken link."""

from __future__ import annotations

import subprocess
import sys

import yaml

from conftest import ROOT


def test_readme_is_short_and_points_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert all(f"docs/{page}" in readme for page in pages if page != "index.md")


def test_every_page_is_in_the_nav_and_the_site_builds_strictly(tmp_path):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert sorted(next(iter(entry.values())) for entry in nav) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    assert (tmp_path / "site" / "schemas" / "index.html").exists()
