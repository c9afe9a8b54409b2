"""Configuration: one YAML file in conf/ (default conf/local.yaml), overridable from the CLI.

A file may start with ``extends: local.yaml`` to change only some keys of
another file (``conf/cluster.yaml``, ``conf/secure.yaml``); sections merge key
by key.

Keys are addressed with dots (``kafka.bootstrap_servers``).  A missing key is a
one-line :class:`SkyfilterError` naming the key and the file.  Relative paths are
relative to the project root (the folder holding ``conf/``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from skyfilter.errors import SkyfilterError
from skyfilter.versions import PROJECT_ROOT

DEFAULT_CONFIG = PROJECT_ROOT / "conf" / "local.yaml"
_MISSING = object()


class Config:
    """A loaded configuration file plus overrides.

    Example::

        cfg = Config.load("conf/local.yaml", overrides={"kafka.bootstrap_servers": "127.0.0.1:9092"})
        cfg.get("topics.alerts")          # 'alerts'
        cfg.path("state_dir")             # absolute Path
    """

    def __init__(self, data: dict, source: Path, root: Path = PROJECT_ROOT):
        self.data = data
        self.source = source
        self.root = root

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
        """Read a YAML config (default: $SKYFILTER_CONFIG or conf/local.yaml) and apply overrides (a None
        value sets the key to null, as ``--set key=null`` does)."""
        path = Path(path or os.environ.get("SKYFILTER_CONFIG") or DEFAULT_CONFIG).resolve()
        data = _read_yaml(path)
        root = path.parent.parent if path.parent.name == "conf" else path.parent
        cfg = cls(data, path, root)
        for key, value in (overrides or {}).items():
            cfg.set(key, value)
        return cfg

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value at a dotted key; without a default, a missing key is an error."""
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is not _MISSING:
                    return default
                raise SkyfilterError(f"{self.source}: missing config key '{key}'")
            node = node[part]
        return node

    def set(self, key: str, value: Any) -> None:
        """Override a dotted key (creating intermediate sections)."""
        node = self.data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def section(self, key: str) -> dict:
        """A whole mapping (e.g. the librdkafka settings under ``producer``)."""
        value = self.get(key)
        if not isinstance(value, dict):
            raise SkyfilterError(f"{self.source}: config key '{key}' must be a mapping")
        return dict(value)

    def path(self, key: str) -> Path:
        """A path setting, made absolute against the project root."""
        value = Path(str(self.get(key))).expanduser()
        return value if value.is_absolute() else (self.root / value)

    def copy(self) -> Config:
        """An independent copy, to override without touching the original."""
        return Config(copy.deepcopy(self.data), self.source, self.root)

    # Derived locations, in one place so every tool agrees on them.
    @property
    def state_dir(self) -> Path:
        return self.path("state_dir")

    @property
    def delta_dir(self) -> Path:
        return self.state_dir / "delta"

    @property
    def checkpoint_dir(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def run_dir(self) -> Path:
        """Status, filter-state and error files of running jobs."""
        return self.state_dir / "run"

    def filter_states_file(self, stream: str) -> Path:
        """Where a stream keeps its filters' states (read by `skyfilter filters status`)."""
        return self.run_dir / f"filters.{stream}.json"

    @property
    def bootstrap_servers(self) -> str:
        return str(self.get("kafka.bootstrap_servers"))


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file's settings, merged over the file it ``extends`` (if any)."""
    if not path.exists():
        raise SkyfilterError(f"config file not found: {path}")
    if path in seen:
        raise SkyfilterError(f"{path}: 'extends' loops back to itself")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SkyfilterError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise SkyfilterError(f"{path}: expected a mapping of settings at the top level")
    base = data.pop("extends", None)
    if base is None:
        return data
    return _merge(_read_yaml((path.parent / str(base)).resolve(), (*seen, path)), data)


def _merge(base: dict, changes: dict) -> dict:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            else value
    return merged


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """Turn ``--set key=value`` pairs into overrides (values parsed as YAML scalars)."""
    overrides = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SkyfilterError(f"--set expects key=value, got '{pair}'")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides
