"""An idempotent producer is let in as Kafka lets it in (KIP-679): IdempotentWrite on the
cluster, or Write on any topic that no DENY takes back. Asked of a real Kafka node with the
same SASL users and ACLs as pidctl, ACL set by ACL set: the same answer from both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

# (confluent-kafka's admin package re-exports these without saying so to a type checker.)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from ops.testing.kafka import START_TIMEOUT_S, KafkaNode
from ops.testing.serverproc import ServerProcess, add_sasl_user
from pidctl.client import SyncClient
from pidctl.protocol import requests

#: One SASL user per ACL set: (operation, resource type, name, pattern, permission, host).
ACL_SETS: dict[str, list[tuple[str, str, str, str, str, str]]] = {
    "none": [],
    "idempotent-write": [("IdempotentWrite", "Cluster", "kafka-cluster", "literal", "allow", "*")],
    "write-one-topic": [("Write", "Topic", "orders", "literal", "allow", "*")],
    "write-prefix": [("Write", "Topic", "ord", "prefixed", "allow", "*")],
    "write-every-topic": [("Write", "Topic", "*", "literal", "allow", "*")],
    "all-one-topic": [("All", "Topic", "orders", "literal", "allow", "*")],
    "read-every-topic": [("Read", "Topic", "*", "literal", "allow", "*")],
    "write-from-elsewhere": [("Write", "Topic", "orders", "literal", "allow", "10.9.9.9")],
    "taken-back-literally": [
        ("Write", "Topic", "orders", "literal", "allow", "*"),
        ("Write", "Topic", "orders", "literal", "deny", "*"),
    ],
    "taken-back-by-prefix": [
        ("Write", "Topic", "orders", "literal", "allow", "*"),
        ("All", "Topic", "or", "prefixed", "deny", "*"),
    ],
    "deny-a-longer-prefix": [
        ("Write", "Topic", "ord", "prefixed", "allow", "*"),
        ("Write", "Topic", "orders", "prefixed", "deny", "*"),
    ],
    "deny-every-topic": [
        ("Write", "Topic", "*", "literal", "allow", "*"),
        ("Write", "Topic", "*", "literal", "deny", "*"),
    ],
    "deny-another-topic": [
        ("Write", "Topic", "*", "literal", "allow", "*"),
        ("Write", "Topic", "orders", "literal", "deny", "*"),
    ],
    "idempotent-write-denied-topic-allowed": [
        ("IdempotentWrite", "Cluster", "kafka-cluster", "literal", "deny", "*"),
        ("Write", "Topic", "orders", "literal", "allow", "*"),
    ],
}
#: Written last: once Kafka lets this user in, every ACL before it is in force.
SENTINEL = "sentinel"
PASSWORD = "secret"
LOADING = {14, 15, 16}  # Kafka's answers while its producer id block is on its way


def _user(name: str) -> str:
    return name.replace("-", "_")


def _binding(user: str, acl: tuple[str, str, str, str, str, str]) -> AclBinding:
    operation, resource_type, name, pattern, permission, host = acl
    return AclBinding(
        ResourceType[{"Cluster": "BROKER"}.get(resource_type, resource_type.upper())],
        name,
        ResourcePatternType[pattern.upper()],
        f"User:{user}",
        host,
        AclOperation[{"IdempotentWrite": "IDEMPOTENT_WRITE"}.get(operation, operation.upper())],
        AclPermissionType[permission.upper()],
    )


def _init(bootstrap: str, user: str) -> int:
    with SyncClient(bootstrap, sasl=("PLAIN", user, PASSWORD)) as client:
        answer: Any = client.request(requests.init_producer_id(None))
    return int(answer.error_code)


def _kafka_init(node: KafkaNode, user: str) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (error := _init(node.sasl_bootstrap, user)) in LOADING:
        assert time.monotonic() < deadline, f"Kafka still loading after {START_TIMEOUT_S} s"
        time.sleep(0.2)
    return error


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaNode]:
    users = {_user(name): PASSWORD for name in [*ACL_SETS, SENTINEL]}
    with KafkaNode(sasl_users=users) as node:
        admin = AdminClient({"bootstrap.servers": node.bootstrap})  # a super user
        bindings = [_binding(_user(name), acl) for name, acls in ACL_SETS.items() for acl in acls]
        for future in admin.create_acls(bindings).values():
            future.result(timeout=START_TIMEOUT_S)
        sentinel = ("Write", "Topic", SENTINEL, "literal", "allow", "*")
        for future in admin.create_acls([_binding(SENTINEL, sentinel)]).values():
            future.result(timeout=START_TIMEOUT_S)
        deadline = time.monotonic() + START_TIMEOUT_S
        while _kafka_init(node, SENTINEL) != 0:
            assert time.monotonic() < deadline, "Kafka's ACLs not in force"
            time.sleep(0.2)
        yield node


@pytest.fixture(scope="module")
def pidctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("idempotent-acls")
    users = directory / "users.json"
    for name in ACL_SETS:
        add_sasl_user(users, _user(name), PASSWORD)
    lines = [
        'listeners = "SASL_PLAINTEXT://127.0.0.1:0"',
        f"credentials_file = {json.dumps(str(users))}",
        'sasl_enabled_mechanisms = "PLAIN"',
        'authorizer = "acl"',
    ]
    for name, acls in ACL_SETS.items():
        for operation, resource_type, resource, pattern, permission, host in acls:
            lines += [
                "[[acls]]",
                f'principal = "User:{_user(name)}"',
                f'operation = "{operation}"',
                f'resource_type = "{resource_type}"',
                f'resource_name = "{resource}"',
                f'pattern_type = "{pattern}"',
                f'permission = "{permission}"',
                f'host = "{host}"',
            ]
    config = directory / "pidctl.toml"
    config.write_text("\n".join(lines) + "\n")
    with ServerProcess(directory / "data", "--config", str(config)) as server:
        yield f"127.0.0.1:{server.ports[0]}"


def test_an_idempotent_producer_is_let_in_as_kafka_lets_it_in(
    kafka: KafkaNode, pidctl: str
) -> None:
    kafkas = {name: _kafka_init(kafka, _user(name)) for name in ACL_SETS}
    pidctls = {name: _init(pidctl, _user(name)) for name in ACL_SETS}
    assert pidctls == kafkas
    # The comparison means something: both answers occur, where KIP-679 says.
    assert kafkas["write-one-topic"] == 0
    assert kafkas["none"] == kafkas["taken-back-by-prefix"] == 31
