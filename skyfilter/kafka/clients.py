"""Connection settings of every Kafka client the project creates, in one place.

Every producer, consumer and admin client (confluent-kafka) and every Spark
Kafka source or sink gets its settings from here, so a secure cluster
(``kafka.security``: SASL/SCRAM, optionally over TLS) needs no change anywhere
else.  Each process connects as one *principal*: ``kafka.security.user`` when
set, otherwise the default of the command (``pipeline`` for the Spark jobs,
``producer`` for the producers, ``admin`` for cluster set-up).  Passwords are
read from ``<credentials_dir>/<user>.json`` and never logged.
"""

from __future__ import annotations

import json
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError

PLAINTEXT = "PLAINTEXT"
USER_KEY = "kafka.security.user"


def security_protocol(cfg: Config) -> str:
    """PLAINTEXT, SASL_PLAINTEXT, SASL_SSL or SSL (``kafka.security.protocol``)."""
    protocol = cfg.kafka.security.protocol.upper()
    if protocol not in (PLAINTEXT, "SASL_PLAINTEXT", "SASL_SSL", "SSL"):
        raise SkyfilterError(f"{cfg.source}: kafka.security.protocol must be PLAINTEXT, SASL_PLAINTEXT, "
                             f"SASL_SSL or SSL, got '{protocol}'")
    return protocol


def uses_sasl(cfg: Config) -> bool:
    return security_protocol(cfg).startswith("SASL")


def credentials_dir(cfg: Config) -> Path:
    """Where the per-principal credential files live (default ``<state_dir>/kafka/credentials``)."""
    folder = cfg.kafka.security.credentials_dir
    return cfg.path("kafka.security.credentials_dir") if folder else cfg.state_dir / "kafka" / "credentials"


def act_as(cfg: Config, user: str) -> Config:
    """The config connecting as ``user``, unless the config or ``--set`` already chose a principal."""
    return cfg if cfg.get(USER_KEY, None) else connect_as(cfg, user)


def connect_as(cfg: Config, user: str) -> Config:
    """The config connecting as ``user``, whatever it chose before (set-up runs as admin)."""
    return cfg.with_values({USER_KEY: user})


def principal(cfg: Config) -> str:
    """The SASL user this process connects as."""
    return str(cfg.get(USER_KEY, None) or "pipeline")


def read_credentials(cfg: Config, user: str | None = None) -> tuple[str, str]:
    """(username, password) of a principal, from its credential file."""
    user = user or principal(cfg)
    path = credentials_dir(cfg) / f"{user}.json"
    try:
        entry = json.loads(path.read_text())
        return str(entry["username"]), str(entry["password"])
    except FileNotFoundError:
        raise SkyfilterError(f"no Kafka credentials for principal '{user}' ({path} is missing): "
                             f"`skyfilter kafka grant` creates them on a local secure cluster") from None
    except (ValueError, KeyError):
        raise SkyfilterError(f"{path}: expected JSON with 'username' and 'password'") from None


def client_settings(cfg: Config, **extra: object) -> dict:
    """librdkafka settings (bootstrap, security) for a confluent-kafka client, plus ``extra``."""
    settings: dict = {"bootstrap.servers": cfg.bootstrap_servers}
    protocol = security_protocol(cfg)
    if protocol != PLAINTEXT:
        settings["security.protocol"] = protocol
    if uses_sasl(cfg):
        username, password = read_credentials(cfg)
        settings.update({"sasl.mechanism": cfg.kafka.security.mechanism,
                         "sasl.username": username, "sasl.password": password})
    if protocol.endswith("SSL") and cfg.kafka.security.ssl_ca_location:
        settings["ssl.ca.location"] = str(cfg.path("kafka.security.ssl_ca_location"))
    settings.update(extra)
    return settings


def spark_kafka_options(cfg: Config) -> dict[str, str]:
    """``kafka.*`` options of a Spark Kafka source or sink for the same connection."""
    options = {"kafka.bootstrap.servers": cfg.bootstrap_servers}
    protocol = security_protocol(cfg)
    if protocol != PLAINTEXT:
        options["kafka.security.protocol"] = protocol
    if uses_sasl(cfg):
        username, password = read_credentials(cfg)
        mechanism = cfg.kafka.security.mechanism
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule" if mechanism.startswith("SCRAM")
                  else "org.apache.kafka.common.security.plain.PlainLoginModule")
        options.update({"kafka.sasl.mechanism": mechanism,
                        "kafka.sasl.jaas.config": f'{module} required username="{username}" password="{password}";'})
    if protocol.endswith("SSL") and cfg.kafka.security.ssl_truststore:
        options["kafka.ssl.truststore.location"] = str(cfg.path("kafka.security.ssl_truststore"))
    return options


def spark_source_options(cfg: Config) -> dict[str, str]:
    """Options of the Spark Kafka source: the connection, messages up to the size limit, ``stream.source_options``."""
    extra = cfg.stream.source_options or {}
    return {**spark_kafka_options(cfg), "kafka.max.partition.fetch.bytes": str(cfg.kafka.max_message_bytes),
            **{key: str(value) for key, value in extra.items()}}


def spark_sink_options(cfg: Config) -> dict[str, str]:
    """Options of the Spark Kafka sink: acknowledged by every in-sync replica, idempotent retries."""
    return {**spark_kafka_options(cfg), "kafka.acks": "all", "kafka.enable.idempotence": "true",
            "kafka.max.request.size": str(cfg.kafka.max_message_bytes), "kafka.linger.ms": "5"}
