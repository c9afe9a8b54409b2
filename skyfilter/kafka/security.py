"""Authenticated Kafka: SCRAM principals and ACLs derived from the config and ``brokers.yaml``.

Principals (``User:<name>``):

* ``admin``: the cluster's super user; brokers talk to each other and to the
  controllers as admin, and ``skyfilter kafka start|grant`` sets things up as admin.
* ``pipeline``: the Spark jobs; reads the alert topic, writes the broker
  topics, the dead-letter and nightly topics (``<alerts>.*``) and the errors topic.
* ``producer``: writes the alert topic.
* one per downstream broker in ``brokers.yaml``: reads only its own topic, in
  consumer groups named after it (``<broker>`` or ``<broker>.*``).

Every principal may read the schema registry topic (it holds public schemas
that ``lite`` consumers need).  Passwords are random, generated once into
``<credentials_dir>/<user>.json`` (mode 0600) and never printed.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from skyfilter.core.brokers import BrokerSpec, load_brokers
from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.kafka.clients import credentials_dir, read_credentials

ADMIN = "admin"
SERVICE_USERS = ("pipeline", "producer")


@dataclass(frozen=True)
class Grant:
    """Operations a user may do on one resource (a topic or group, by literal name or prefix)."""

    user: str
    resource: str        # "topic" | "group"
    name: str
    prefixed: bool
    operations: tuple[str, ...]


def ensure_credentials(cfg: Config, users: list[str]) -> list[str]:
    """Write a random password for every user that has none yet; returns the users created."""
    folder = credentials_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    created = []
    for user in users:
        path = folder / f"{user}.json"
        if path.exists():
            continue
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump({"username": user, "password": secrets.token_urlsafe(24)}, out)
        created.append(user)
    return created


def principals(brokers: list[BrokerSpec]) -> list[str]:
    """Every user a secure cluster needs, admin first."""
    names = [b.name for b in brokers]
    clash = sorted(set(names) & {ADMIN, *SERVICE_USERS})
    if clash:
        raise SkyfilterError(f"broker name(s) {', '.join(clash)} clash with the service principals "
                             f"({ADMIN}, {', '.join(SERVICE_USERS)}): rename them in brokers.yaml")
    return [ADMIN, *SERVICE_USERS, *names]


def grants(cfg: Config, brokers: list[BrokerSpec]) -> list[Grant]:
    """The least-privilege ACLs of the pipeline, the producer and every broker."""
    alerts = cfg.topics.alerts
    registry = cfg.schema_registry.topic
    errors = cfg.topics.errors
    read, write = ("READ", "DESCRIBE"), ("CREATE", "WRITE", "DESCRIBE")
    rules = [
        Grant("pipeline", "topic", alerts, False, read),
        Grant("pipeline", "topic", f"{alerts}.", True, write),      # dead letters, nightly copies, replays
        Grant("pipeline", "topic", f"{alerts}.delivery-log", True, read),  # the archive lane reads what was sent
        Grant("pipeline", "topic", f"{alerts}.rehearsal", True, read),  # the night rehearsed before it starts
        Grant("pipeline", "group", "skyfilter-rehearsal-", True, ("READ",)),
        Grant("pipeline", "topic", errors, False, write),
        Grant("pipeline", "topic", registry, False, (*write, "READ")),
        Grant("pipeline", "group", "spark-kafka-", True, ("READ",)),
        Grant("producer", "topic", alerts, False, write),
        Grant("producer", "topic", registry, False, (*write, "READ")),
    ]
    for broker in brokers:
        rules += [Grant("pipeline", "topic", broker.topic, False, write),
                  Grant(broker.name, "topic", broker.topic, False, read),
                  Grant(broker.name, "group", broker.name, False, ("READ",)),
                  Grant(broker.name, "group", f"{broker.name}.", True, ("READ",)),
                  Grant(broker.name, "topic", registry, False, read)]
    rules += [Grant(user, "group", "skyfilter-registry-", True, ("READ",))
              for user in [*SERVICE_USERS, *(b.name for b in brokers)]]
    return rules


def server_settings(cfg: Config) -> str:
    """Lines added to every node's server.properties: SCRAM on the client listener, PLAIN
    between controllers (KRaft cannot use SCRAM there), the standard authorizer."""
    _, password = read_credentials(cfg, ADMIN)
    mechanism = cfg.kafka.security.mechanism
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    lower = mechanism.lower()
    return "\n".join([
        "# Authentication and authorization (kafka.security): generated, holds secrets, not for sharing.",
        f"listener.name.client.sasl.enabled.mechanisms={mechanism}",
        f'listener.name.client.{lower}.sasl.jaas.config={scram} required username="{ADMIN}" password="{password}";',
        f"sasl.mechanism.inter.broker.protocol={mechanism}",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        f'listener.name.controller.plain.sasl.jaas.config={plain} required username="{ADMIN}" '
        f'password="{password}" user_{ADMIN}="{password}";',
        "sasl.mechanism.controller.protocol=PLAIN",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN}",
        "allow.everyone.if.no.acl.found=false",
        "",
    ])


def format_arguments(cfg: Config) -> list[str]:
    """kafka-storage format arguments that bootstrap the admin's SCRAM credential (KIP-900)."""
    _, password = read_credentials(cfg, ADMIN)
    return ["--add-scram", f"{cfg.get('kafka.security.mechanism')}=[name={ADMIN},password={password}]"]


def grant(cfg: Config, brokers_file: str | Path | None = None) -> dict[str, int]:
    """Create missing principals' credentials and SCRAM logins, and every ACL, as admin.

    Safe to repeat (after editing brokers.yaml): passwords already generated are
    kept, logins are re-set to them and ACLs that exist stay as they are.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from skyfilter.kafka.clients import client_settings, connect_as

    brokers = load_brokers(brokers_file or cfg.path("stream.brokers"))
    users = principals(brokers)
    ensure_credentials(cfg, users)
    admin = AdminClient(client_settings(connect_as(cfg, ADMIN), log_level=0))
    mechanism = getattr(ScramMechanism, cfg.kafka.security.mechanism.replace("-", "_"))
    upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 8192),
                                            read_credentials(cfg, user)[1].encode())
               for user in users if user != ADMIN]
    try:
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result()
        bindings = [AclBinding(getattr(ResourceType, g.resource.upper()), g.name,
                               ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL,
                               f"User:{g.user}", "*", getattr(AclOperation, operation), AclPermissionType.ALLOW)
                    for g in grants(cfg, brokers) for operation in g.operations]
        for future in admin.create_acls(bindings).values():
            future.result()
    except KafkaException as exc:
        raise SkyfilterError(f"setting up principals and ACLs on {cfg.bootstrap_servers} failed: "
                             f"{exc.args[0].str()}") from None
    return {"principals": len(users), "acls": len(bindings)}
