"""The command blocks of the README and the docs, run as a reader runs them: in order, in one shell, as written.

A ```` ```bash ```` block is marked on the line before it:

* ``<!-- run -->``: run it;
* ``<!-- not run: why -->``: do not (the set-up itself, a cluster, Docker...).

Lines ``<!-- expect: REGEX -->`` right after a run block are what it claims: each
must match (``re.search``, multi-line) the output of that block.  Every block of a
document runs in one ``bash`` (``set -eo pipefail``), so a background job, a ``cd``
or a variable carries on to the next block, and the first command that fails stops
the run and is reported with its block.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RUN = re.compile(r"^<!--\s*run\s*-->$")
NOT_RUN = re.compile(r"^<!--\s*not run:.+-->$")
EXPECT = re.compile(r"^<!--\s*expect:\s*(.+?)\s*-->$")
MARK = "@@doc-block"


@dataclass
class Block:
    """One fenced command block of a document."""

    document: Path
    line: int          # where its fence opens (1-based)
    text: str
    marker: str        # "run", "not run" or "" (unmarked)
    expects: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.document.name}:{self.line}"


def blocks(document: Path) -> list[Block]:
    """Every ```` ```bash ```` (or ``sh``) block of a Markdown file, with its marker and expectations."""
    lines = document.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() in ("```bash", "```sh", "```shell"):
            start = i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            marker = "run" if RUN.match(before) else "not run" if NOT_RUN.match(before) else ""
            expects, j = [], end + 1
            while j < len(lines) and (not lines[j].strip() or EXPECT.match(lines[j].strip())):
                if lines[j].strip():
                    expects.append(EXPECT.match(lines[j].strip()).group(1))
                j += 1
            found.append(Block(document, start + 1, "\n".join(lines[start + 1:end]), marker, expects))
            i = end
        i += 1
    return found


@dataclass
class DocRun:
    """What running a document's blocks gave."""

    outputs: list[str]     # per block that started, its output
    code: int              # the shell's exit code (-1: timed out)
    failed: Block | None   # the block the run stopped in
    log: str               # everything the shell printed

    def problems(self, run_blocks: list[Block]) -> list[str]:
        """One line per failed block or unmet expectation; empty when the document ran as it says."""
        if self.failed is not None:
            tail = "\n".join(self.outputs[-1].splitlines()[-25:]) if self.outputs else ""
            return [f"{self.failed.where}: the block stopped with exit code {self.code}:\n{tail}"]
        lines = []
        for block, output in zip(run_blocks, self.outputs, strict=False):
            lines += [f"{block.where}: no output matches {pattern!r}" for pattern in block.expects
                      if not re.search(pattern, output, re.MULTILINE)]
        return lines


def scratch_checkout(root: Path, target: Path) -> Path:
    """A copy of the checkout's files (tracked and new, not ignored) at ``target``, with the real venv linked in:
    a reader's checkout after `make setup`, which the blocks may change freely."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)
    (target / ".venv").symlink_to(root / ".venv")
    return target


def run_blocks(run: list[Block], cwd: Path, env: dict[str, str], timeout_s: float) -> DocRun:
    """Run ``run`` in one ``bash`` in ``cwd``; whatever it leaves running (its process group) is stopped after."""
    script = ["set -eo pipefail"]
    for i, block in enumerate(run):
        script += [f"echo '{MARK} {i} start'", block.text, f"echo '{MARK} {i} end'"]
    shell = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = shell.communicate(timeout=timeout_s)
        code = shell.returncode
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        log, _ = shell.communicate()
        code = -1
    finally:
        stop_group(shell.pid)
    outputs, current, ended = [], None, set()
    for line in log.splitlines():
        mark = re.match(rf"^{MARK} (\d+) (start|end)$", line)
        if mark and mark.group(2) == "start":
            current = int(mark.group(1))
            outputs.append("")
        elif mark:
            ended.add(int(mark.group(1)))
        elif current is not None:
            outputs[current] += line + "\n"
    failed = next((run[i] for i in range(len(outputs)) if i not in ended), None)
    if failed is None and (code != 0 or len(ended) < len(run)):
        failed = run[len(outputs) - 1] if outputs else run[0]
    return DocRun(outputs, code, failed, log)


def stop_group(pgid: int) -> None:
    """SIGTERM the process group ``pgid`` (a shell's background jobs), then SIGKILL what is left after 30 s."""
    def members() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == pgid:
                    found.append(process)
            except OSError:
                pass
        return found

    for process in members():
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while members() and time.monotonic() < deadline:
        time.sleep(0.5)
    for process in members():
        with contextlib.suppress(psutil.Error):
            process.kill()
