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


def test_every_module_says_what_it_does_through_logging_not_a_log_parameter():
    """No ``log=print`` threading: each module logs to its logger under ``skyfilter``; a module that also runs as
    ``__main__`` (``python -m``, the demo's ``spark-submit <module file>``) names its logger, so its lines still
    reach the console ``log_to_console`` set up."""
    offenders, unnamed = [], []
    for path in sorted((ROOT / "skyfilter").rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = [*node.args.args, *node.args.kwonlyargs]
                defaults = dict(zip([a.arg for a in arguments][::-1], [*node.args.defaults[::-1],
                                                                       *node.args.kw_defaults[::-1]], strict=False))
                if "log" in [a.arg for a in arguments] or isinstance(defaults.get("log"), ast.Name):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
        if '__name__ == "__main__"' in text and "getLogger(__name__)" in text:
            unnamed.append(str(path.relative_to(ROOT)))
    assert not offenders, f"a log parameter: {offenders}"
    assert not unnamed, f"runs as __main__ but logs as __main__ (its lines would go nowhere): {unnamed}"


def test_log_lines_reach_the_console_as_they_are_and_the_log_file_with_time_level_and_module(tmp_path, capsys):
    import logging
    import threading

    from skyfilter.core.log import ROOT_LOGGER, captured, console_level, console_prefix, log_to_console

    root = logging.getLogger(ROOT_LOGGER)
    before = list(root.handlers), root.propagate
    for handler in before[0]:  # a command run in this process earlier set its console up already
        root.removeHandler(handler)
    try:
        log_to_console(tmp_path / "run.log")
        log_to_console(tmp_path / "other.log")  # once is enough: nothing doubles
        job = logging.getLogger("skyfilter.jobs.example")
        with captured() as lines:
            job.info("stream 'night' running: realtime")
            worker = threading.Thread(target=lambda: job.warning("filter 'x' quarantined"))
            worker.start()
            worker.join()
            with console_prefix("    "):
                job.info("visit 1/2: 10 alerts")
            with console_level(logging.WARNING):
                job.info("only in the file")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in before[0]:
            root.addHandler(handler)
        root.propagate = before[1]
    assert capsys.readouterr().out.splitlines() == ["stream 'night' running: realtime", "filter 'x' quarantined",
                                                    "    visit 1/2: 10 alerts"]
    assert lines == ["stream 'night' running: realtime", "filter 'x' quarantined", "visit 1/2: 10 alerts",
                     "only in the file"], "every thread's lines, as said"
    written = (tmp_path / "run.log").read_text().splitlines()
    assert len(written) == 4 and not (tmp_path / "other.log").exists()
    assert written[1].endswith(" WARNING skyfilter.jobs.example: filter 'x' quarantined"), written[1]
    assert written[3].endswith(" INFO skyfilter.jobs.example: only in the file")


def test_a_console_whose_stream_was_closed_never_fails_the_code_that_logs(capsys):
    """A test harness closes the stdout it swapped out; a command run in-process before keeps its console."""
    import io
    import logging
    import sys

    from skyfilter.core.log import ROOT_LOGGER, _Flushing

    console = _Flushing()
    closed = io.StringIO()
    console.stream = closed
    closed.close()
    logger = logging.getLogger(ROOT_LOGGER)
    logger.addHandler(console)
    try:
        logging.getLogger("skyfilter.jobs.example").info("still said")
    finally:
        logger.removeHandler(console)
    assert console.stream is sys.stdout and "still said" in capsys.readouterr().out
