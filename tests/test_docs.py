"""The documentation: a short README pointing into docs/, and a docs site that builds with no broken link."""

from __future__ import annotations

import argparse
import re
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


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser: each `skyfilter` subcommand and each pipeline job."""
    from skyfilter.cli import build_parser
    from skyfilter.jobs import filter_stream, maintain, replay_night, trigger_report

    def commands(prefix: str, parser: argparse.ArgumentParser) -> dict:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            return {prefix: parser}
        return {k: v for name, inner in nested[0].choices.items() for k, v in commands(f"{prefix} {name}",
                                                                                     inner).items()}

    found = commands("skyfilter", build_parser())
    for module in (filter_stream, replay_night, maintain, trigger_report):
        captured = {}

        def keep(self, args=None, namespace=None, sink=captured):
            sink["parser"] = self
            raise SystemExit(0)

        original = argparse.ArgumentParser.parse_args
        argparse.ArgumentParser.parse_args = keep
        try:
            getattr(module, "parse_args", module.main)(["--help"])
        except SystemExit:
            pass
        finally:
            argparse.ArgumentParser.parse_args = original
        found[f"{module.__name__.rsplit('.', 1)[-1]}.py"] = captured["parser"]
    return found


SHARED_OPTIONS = {"--help", "--config", "--set", "--state-dir", "--bootstrap"}  # stated once, above the table


def test_every_command_line_option_is_in_the_running_page():
    running = (ROOT / "docs" / "running.md").read_text()
    assert all(f"`{option}" in running.split("|")[0] for option in SHARED_OPTIONS - {"--help"})
    missing = []
    for command, parser in _parsers().items():
        rows = [line for line in running.splitlines() if f"`{command}" in line or f"pipelines/{command}" in line]
        assert rows, f"docs/running.md has no row for {command}"
        missing += [f"{command} {option}" for action in parser._actions for option in action.option_strings
                    if option.startswith("--") and option not in SHARED_OPTIONS
                    and not any(re.search(rf"{re.escape(option)}\b", row) for row in rows)]
    assert not missing, f"options not in their command's rows of docs/running.md: {missing}"


def _shipped_settings() -> dict[str, str]:
    def flatten(prefix: str, value) -> dict:
        if isinstance(value, dict):
            return {k: v for key, inner in value.items() for k, v in flatten(f"{prefix}{key}.", inner).items()}
        return {prefix[:-1]: value}

    settings = flatten("", yaml.safe_load((ROOT / "conf" / "local.yaml").read_text()))
    for line in (ROOT / "conf" / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split(None, 1)
            settings[key] = value.strip()
    return settings


def _same_value(stated: str, shipped) -> bool:
    def norm(text) -> str:
        text = str(text).lower().replace(",", "").replace(" ", "").strip("\"'")
        for unit, short in (("gb", "g"), ("mb", "m")):
            text = text.replace(unit, short)
        return re.sub(r"(?<=\d)(s|seconds?)$", "", text)

    return norm(stated) == norm("null" if shipped is None else shipped)


def test_every_default_the_docs_state_is_the_shipped_one():
    settings = _shipped_settings()
    stated = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for found in re.finditer(r"`([a-z_]+(?:\.[a-z_.]+)+)` \(([^()]{1,20})\)", text):
            stated.append((page.name, found.group(1), found.group(2)))
        for found in re.finditer(r"default[^.`]{0,30}`([a-z_]+(?:\.[a-z_.]+)+)(?:: |=)([^`]+)`", text):
            stated.append((page.name, found.group(1), found.group(2)))
        for found in re.finditer(r"^\| `([a-z_]+(?:\.[a-z_.]+)+)` \| `([^`]+)` \|", text, re.MULTILINE):
            stated.append((page.name, found.group(1), found.group(2)))
    checked = [(page, key, value) for page, key, value in stated if key in settings
               and re.match(r"^[\d.,]+ ?\w*$|^(true|false|null|auto|\w+)$", value.strip())]
    wrong = [f"{page}: `{key}` stated {value}, shipped {settings[key]}" for page, key, value in checked
             if not _same_value(value, settings[key])]
    assert len(checked) >= 20 and not wrong, wrong
