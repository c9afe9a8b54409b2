"""Configuration: one YAML file (default: the packaged ``local.yaml``, shown as conf/local.yaml in a checkout),
overridable from the CLI.

A file may start with ``extends: local.yaml`` to change only some keys of
another file (``conf/cluster.yaml``, ``conf/secure.yaml``); sections merge key
by key.  Whatever a file (and the files it extends) does not say, the defaults
say.

Keys are addressed with dots (``kafka.bootstrap_servers``).  A missing key is a
one-line :class:`SkyfilterError` naming the key and the file.  Relative paths are
relative to the project root: the folder holding the file's ``conf/`` folder, and for
the packaged defaults the checkout skyfilter runs from (else the working directory).

``conf/local.yaml`` is the one place defaults live; what kind of value each key
takes is declared once, as typed section objects (:mod:`skyfilter.core.config_types`).
Every file and ``--set`` is checked against them when a config is loaded, so a
misspelt or unknown key, or a value of the wrong kind, is one error naming the
file and the key instead of a setting silently ignored; the code then reads the
sections as objects (``cfg.stream.trigger``, ``cfg.archive.nice``).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

from skyfilter.core import config_types as settings
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.versions import PACKAGE_DATA, PROJECT_ROOT

DEFAULT_CONFIG = PACKAGE_DATA / "local.yaml"
_MISSING = object()


S = TypeVar("S")


class _Section(Generic[S]):
    """A section of a :class:`Config` as its typed object (``cfg.stream``)."""

    def __init__(self, kind: type[S]):
        self.kind = kind

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, cfg: Config, owner: type | None = None) -> S:
        return getattr(cfg.sections, self.name)


class Config:
    """A loaded configuration file plus overrides.

    Example::

        cfg = Config.load("conf/local.yaml", overrides={"kafka.bootstrap_servers": "127.0.0.1:9092"})
        cfg.topics.alerts          # 'alerts'
        cfg.path("state_dir")             # absolute Path
    """

    def __init__(self, data: dict, source: Path, root: Path = PROJECT_ROOT):
        self.data = data
        self.source = source
        self.root = root
        self._sections: settings.Sections | None = None

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
        """Read a YAML config (default: $SKYFILTER_CONFIG or conf/local.yaml) and apply overrides (a None
        value sets the key to null, as ``--set key=null`` does)."""
        given = Path(path or os.environ.get("SKYFILTER_CONFIG") or DEFAULT_CONFIG).absolute()
        path = given.resolve()
        data = _read_yaml(path)
        defaults = path == DEFAULT_CONFIG.resolve()
        settings.check_settings(data, str(path))
        if not defaults:  # what a file does not say, the defaults do
            data = _merge(_read_yaml(DEFAULT_CONFIG), data)
        root = given.parent.parent if given.parent.name == "conf" else PROJECT_ROOT if defaults else given.parent
        for key, value in (overrides or {}).items():
            settings.check_settings(_nested(key, value), f"--set {key}")
            _put(data, key, value)
        cfg = cls(data, path, root)
        cfg.sections  # noqa: B018 - a key no file gives is an error now, not when first read
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

    def with_values(self, changes: dict[str, Any]) -> Config:
        """A new config: this one with the dotted keys of ``changes`` set, each read as its key's type.  A
        config never changes once loaded; what a command settles (a port, the servers of the Kafka it started)
        makes a new one to hand down."""
        data = copy.deepcopy(self.data)
        for key, value in changes.items():
            _put(data, key, value)
        changed = Config(data, self.source, self.root)
        changed.sections  # noqa: B018 - a wrong value is an error here, where it was set
        return changed

    def save(self, path: Path) -> Path:
        """Write this config as it stands, for a process this one starts (:meth:`saved` reads it back)."""
        path.write_text(json.dumps({"data": self.data, "source": str(self.source), "root": str(self.root)},
                                   default=str))
        return path

    @classmethod
    def saved(cls, path: str | Path) -> Config:
        """A config another process settled and saved: taken as it is, no file read again, nothing overridden."""
        saved = json.loads(Path(path).read_text())
        cfg = cls(saved["data"], Path(saved["source"]), Path(saved["root"]))
        cfg.sections  # noqa: B018 - checked as a loaded one is
        return cfg

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

    @property
    def sections(self) -> settings.Sections:
        """The whole configuration as typed section objects."""
        if self._sections is None:
            self._sections = settings.typed(self.data, str(self.source))
        return self._sections

    kafka = _Section(settings.Kafka)
    topics = _Section(settings.Topics)
    stream = _Section(settings.Stream)
    archive = _Section(settings.Archive)
    schema_registry = _Section(settings.SchemaRegistry)
    simulation = _Section(settings.Simulation)
    monitoring = _Section(settings.Monitoring)
    maintenance = _Section(settings.Maintenance)
    spark_cluster = _Section(settings.SparkCluster)
    bench = _Section(settings.Bench)

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
        return self.kafka.bootstrap_servers


def _put(data: dict, key: str, value: Any) -> None:
    """Set dotted ``key`` of the mapping ``data`` (creating intermediate sections): while a config is made."""
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _nested(key: str, value: Any) -> dict:
    """``a.b.c=value`` as ``{a: {b: {c: value}}}``."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


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
    beside = path.parent / str(base)
    if not beside.exists() and (PACKAGE_DATA / str(base)).exists():  # a file of one's own extends the packaged one
        beside = PACKAGE_DATA / str(base)
    return _merge(_read_yaml(beside.resolve(), (*seen, path)), data)


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
