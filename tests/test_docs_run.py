"""The README's command blocks, and the docs' blocks marked to run, run as a reader runs them.

After the set-up the README names (the venv and jars `make test` installed), in a
scratch copy of the checkout with its own state folder and Kafka ports, in a
fresh shell (no venv on the PATH): every block in order, exactly as written; what a
block claims (``<!-- expect: ... -->``) must be in its output (``tests/doc_blocks.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from doc_blocks import blocks, run_blocks, scratch_checkout

from conftest import ROOT, port_base
from skyfilter.local.kafka import free_port_pair
from skyfilter.local.processes import free_port

VENV_BIN = str(Path(sys.executable).parent)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = [d for d in DOCUMENTS if any(b.marker == "run" for b in blocks(d))]


def test_every_readme_block_says_whether_it_runs():
    readme = blocks(ROOT / "README.md")
    unmarked = [b.where for b in readme if not b.marker]
    assert not unmarked, f"mark these <!-- run --> or <!-- not run: why -->: {unmarked}"
    assert sum(b.marker == "run" for b in readme) >= 4
    assert all(not b.expects for b in readme if b.marker != "run"), "claims are checked on run blocks only"


def test_a_failing_command_or_an_unmet_claim_fails_the_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n```bash\necho first block\n```\n<!-- expect: first block -->\n\n"
                    "<!-- run -->\n```bash\necho second\n```\n<!-- expect: a line nobody prints -->\n\n"
                    "<!-- run -->\n```bash\ntrue\nno-such-command --flag\necho never\n```\n"
                    "<!-- not run: only shown -->\n```bash\nrm -rf /\n```\n")
    found = blocks(page)
    assert [b.marker for b in found] == ["run", "run", "run", "not run"]
    run = [b for b in found if b.marker == "run"]
    result = run_blocks(run, tmp_path, dict(os.environ), timeout_s=30)
    [problem] = result.problems(run)
    assert problem.startswith("page.md:14: the block stopped with exit code 127") and "no-such-command" in problem
    claims = run_blocks(run[:2], tmp_path, dict(os.environ), timeout_s=30).problems(run[:2])
    assert claims == ["page.md:8: no output matches 'a line nobody prints'"]


def _fresh_shell(config: Path) -> dict[str, str]:
    """A new terminal's environment: no venv on the PATH, the scratch config chosen."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "SPARK_HOME")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != VENV_BIN)
    env["SKYFILTER_CONFIG"] = str(config)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("document", RUNNABLE, ids=lambda d: d.name)
def test_the_documented_commands_run_as_written(document, tmp_path):
    checkout = scratch_checkout(ROOT, tmp_path / "checkout")
    port = free_port_pair(port_base(19600))
    config = checkout / "conf" / "scratch.yaml"  # a reader's own machine: its ports, its state folder
    config.write_text(yaml.safe_dump({
        "kafka": {"libs_dir": str(ROOT / ".local" / "kafka" / "libs"), "base_port": port,
                  "bootstrap_servers": f"127.0.0.1:{port}", "heap": "512m"},
        "monitoring": {"port": free_port(port_base(19700)), "archive_port": free_port(port_base(19750))},
        "schema_registry": {"serve": {"port": free_port(port_base(19800))}}}))
    env = _fresh_shell(config)
    run = [b for b in blocks(checkout / document.relative_to(ROOT)) if b.marker == "run"]
    try:
        result = run_blocks(run, checkout, env, timeout_s=900)
    finally:
        subprocess.run([f"{VENV_BIN}/skyfilter", "kafka", "stop"], env=env, cwd=checkout, capture_output=True)
        for process in psutil.process_iter(["cmdline"]):
            if str(checkout) in " ".join(process.info["cmdline"] or []):
                process.kill()
    (tmp_path / "run.log").write_text(result.log)
    assert not result.problems(run), "\n".join(result.problems(run))
    stream_log = checkout / "stream.log"
    if stream_log.exists():  # a stream started and stopped as the document says: a quiet console
        assert not [line for line in stream_log.read_text().splitlines() if " ERROR " in line], \
            stream_log.read_text()[-3000:]
