"""A CPU share the kernel enforces: a control group whose processes run only on cores the others leave idle.

``nice`` weighs a process against the others of its own session only (Linux
schedules sessions as groups, "autogroup"), and a niced process still keeps
its timeslice when a busier one wakes.  A control group marked idle
(``cpu.idle``, Linux 5.15) has the weight of a ``SCHED_IDLE`` task against its
siblings, and a waking task of any other group preempts it at once: the
archive lane in such a group takes the CPU only in the gaps delivery leaves.
Where the kernel has no ``cpu.idle``, the group gets the lowest weight there is.

Both cgroup layouts are handled: v2 (one tree, ``cpu.weight``) and v1 (a
``cpu`` controller hierarchy, ``cpu.shares``).  Creating a group needs write
access to the tree (root, or a delegated subtree); without it
:func:`idle_group` says why and the caller falls back to ``nice``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class IdleGroup:
    """A control group of idle CPU priority (see the module)."""

    path: Path
    idle: bool  # cpu.idle set (else only the lowest weight)

    def join(self, pid: int = 0) -> None:
        """Move process ``pid`` (0: the calling process) into the group; its later threads and children follow."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove the group once its processes have exited (a group with processes stays)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def __str__(self) -> str:
        return f"{self.path} ({'cpu.idle' if self.idle else 'lowest CPU weight'})"


def cpu_hierarchy(root: Path = CGROUP_ROOT) -> tuple[Path, str] | None:
    """The folder of the cgroup hierarchy with the ``cpu`` controller and its version (``v2`` or ``v1``)."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return root, "v2"
    if (root / "cpu" / "cpu.shares").exists():
        return root / "cpu", "v1"
    return None


def idle_group(name: str, root: Path = CGROUP_ROOT) -> tuple[IdleGroup | None, str]:
    """Create (or reuse) the group ``name`` of idle CPU priority; (group, how) or (None, why not)."""
    found = cpu_hierarchy(root)
    if found is None:
        return None, "no cgroup hierarchy with the cpu controller"
    hierarchy, version = found
    for stale in hierarchy.glob("skyfilter-*"):  # groups left by killed jobs: removed once empty
        with contextlib.suppress(OSError):
            stale.rmdir()
    path = hierarchy / name
    try:
        path.mkdir(exist_ok=True)
        if version == "v2":
            (path / "cpu.weight").write_text("1")
        else:
            (path / "cpu.shares").write_text("2")
        idle = False
        if (path / "cpu.idle").exists():
            (path / "cpu.idle").write_text("1")
            idle = True
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None, f"cannot create {path}: {exc.strerror or exc}"
    return IdleGroup(path, idle), f"cgroup {version}"


def group_name(label: str) -> str:
    """A group name for one process of this machine: the label and this process's pid."""
    return f"skyfilter-{label}-{os.getpid()}"
