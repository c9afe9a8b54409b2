"""skyfilter installs as one package: the wheel holds only ``skyfilter`` (its layers as sub-packages) and its
defaults, and an installed copy, away from any checkout, runs on the packaged defaults."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

# bottom to top (equal ranks never import each other); the command (cli, demo, authoring) above them all
RANKS = {"core": 0, "schemas": 1, "kafka": 1, "registry": 2, "local": 2, "producers": 3, "spark": 3, "watch": 4,
         "filtering": 5, "plan": 6, "lanes": 7, "delivery": 8, "archive": 8, "tools": 9, "jobs": 9, "commands": 10}
LAYERS = list(RANKS)


def test_the_wheel_is_one_package_with_its_defaults(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(ROOT)], check=True, capture_output=True, timeout=120)
    [wheel] = (tmp_path / "wheel").glob("skyfilter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"skyfilter", wheel.name.split("-py3")[0] + ".dist-info"}
    assert {"skyfilter/defaults/local.yaml", "skyfilter/defaults/versions.env"} <= set(names)
    assert {f"skyfilter/{layer}/__init__.py" for layer in LAYERS} <= set(names)

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = subprocess.run(
        [sys.executable, "-c", "from skyfilter.core.config import Config; cfg = Config.load(); "
                               "print(cfg.source); print(cfg.state_dir)"],
        cwd=elsewhere, env={"PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    source, state_dir = shown.stdout.split()
    assert source == str(tmp_path / "site" / "skyfilter" / "defaults" / "local.yaml")
    assert state_dir == str(elsewhere / ".local" / "state"), "relative paths start at the working directory"


def test_no_layer_imports_a_layer_above_it():
    """core <- schemas, kafka <- registry, local <- producers, spark <- watch <- filtering <- plan <- lanes <-
    delivery, archive <- tools, jobs <- commands: an import never runs back up, nor sideways between packages
    of one rank."""
    rank = RANKS
    upward = []
    for layer in LAYERS:
        for module in (ROOT / "skyfilter" / layer).glob("*.py"):
            for node in ast.walk(ast.parse(module.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                    [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    parts = name.split(".")
                    if parts[0] != "skyfilter":
                        continue
                    target = parts[1] if len(parts) > 1 else "skyfilter"
                    if target not in rank or rank[target] > rank[layer] or \
                            (target != layer and rank[target] == rank[layer]):
                        upward.append(f"{module.relative_to(ROOT)} imports {name}")
    assert upward == []


def test_the_scripts_are_thin_entry_points():
    for script in [*(ROOT / "pipelines").glob("*.py"), ROOT / "producers" / "produce.py"]:
        code = [line for line in script.read_text().split('"""')[-1].splitlines() if line.strip()]
        assert len(code) <= 5 and "sys.path" not in script.read_text(), script
    assert not list(Path(ROOT / "pipelines").glob("__init__.py"))
