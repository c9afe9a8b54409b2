"""The flags every command and job shares (``--config``, ``--set``, ``--state-dir``, ``--bootstrap``), and the
config they produce: the file, the overrides, then the flags, and the local Kafka a state dir runs."""

from __future__ import annotations

import argparse
from typing import Any

from skyfilter.core.config import Config, parse_overrides
from skyfilter.core.errors import SkyfilterError
from skyfilter.local.kafka import LocalKafka


def add_config_arguments(parser: argparse.ArgumentParser, state_dir: str | None = None,
                         bootstrap: bool = False) -> None:
    """The flags every command and job shares: ``--config`` and ``--set``; ``--state-dir`` (described by
    ``state_dir``) and ``--bootstrap`` where they apply.  Read them back with :func:`config_from_args`."""
    if bootstrap:
        parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: kafka.bootstrap_servers)")
    if state_dir:
        parser.add_argument("--state-dir", help=f"{state_dir} (default: state_dir)")
    parser.add_argument("--config", help="YAML config (default: conf/local.yaml or $SKYFILTER_CONFIG)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a config key, e.g. --set kafka.heap=1g (repeatable)")


def config_from_args(args: argparse.Namespace, flags: dict[str, Any] | None = None) -> Config:
    """The config named by ``--config`` with the ``--set`` overrides, then ``--state-dir``, ``--bootstrap`` and
    a command's own ``flags`` (config key -> value; None = not given) on top."""
    overrides = parse_overrides(getattr(args, "set", None))
    given = {"kafka.bootstrap_servers": getattr(args, "bootstrap", None),
             "state_dir": getattr(args, "state_dir", None), **(flags or {})}
    cfg = Config.load(getattr(args, "config", None),
                      {**overrides, **{key: value for key, value in given.items() if value is not None}})
    if given["kafka.bootstrap_servers"] is None and "kafka.bootstrap_servers" not in overrides:
        running = _local_kafka(cfg, explicit_state_dir=given["state_dir"] is not None)
        if running:
            cfg = cfg.with_values({"kafka.bootstrap_servers": running})
    return cfg


def _local_kafka(cfg: Config, explicit_state_dir: bool) -> str | None:
    """The bootstrap servers of the local Kafka running under ``cfg``'s state dir (``skyfilter kafka start --port
    P --state-dir S`` listens where the config does not say), when the user named that state dir or the config
    names a local address; else None."""
    configured = str(cfg.get("kafka.bootstrap_servers", "") or "")
    if not explicit_state_dir and not all(host.split(":")[0] in ("127.0.0.1", "localhost")
                                          for host in configured.split(",") if host):
        return None
    try:
        running = [f"127.0.0.1:{row['port']}" for row in LocalKafka(cfg).status() if row["pid"]]
    except (SkyfilterError, OSError, ValueError):
        return None
    return ",".join(running) or None
