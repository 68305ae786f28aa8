"""Authorisation with Kafka's ACL model (StandardAuthorizer rules), pure.

An ACL allows or denies a principal an operation on resources matched by a literal name, a
prefix, or ``*``, from a host (``*`` for any). Super users may do everything; otherwise a
matching DENY beats any ALLOW, and with no matching ALLOW the answer is no. Describe is
implied by Read, Write, Delete and Alter, as in Kafka; All implies every operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pidctl.controller.core.kafka import CLUSTER_RESOURCE

OPERATIONS: Final = (
    "All",
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "DescribeConfigs",
    "AlterConfigs",
    "IdempotentWrite",
)
#: Kafka's resource types pidctl checks, and ``AppId``, pidctl's own: a named job's app id
#: (``txnAppId``, a stream's query id: ``core/jobs.py``), authorised as Kafka authorises a
#: TransactionalId (Write to record and re-run its versions, Describe implied by it).
APP_ID: Final = "AppId"
RESOURCE_TYPES: Final = ("Cluster", "TransactionalId", "Topic", "Group", APP_ID)
PATTERN_TYPES: Final = ("literal", "prefixed")
PERMISSIONS: Final = ("allow", "deny")

_IMPLIED_BY: Final = {"Describe": {"Read", "Write", "Delete", "Alter"}}
#: Kafka's AclEntry.supportedOperations: what an ACL on each resource type may name (All
#: goes with every type).
SUPPORTED_OPERATIONS: Final = {
    "Topic": {
        "Read",
        "Write",
        "Create",
        "Describe",
        "Delete",
        "Alter",
        "DescribeConfigs",
        "AlterConfigs",
    },
    "Group": {"Read", "Describe", "Delete"},
    "Cluster": {
        "Create",
        "ClusterAction",
        "DescribeConfigs",
        "AlterConfigs",
        "IdempotentWrite",
        "Alter",
        "Describe",
    },
    "TransactionalId": {"Describe", "Write"},
    APP_ID: {"Describe", "Write"},
}


class AclError(ValueError):
    """An ACL entry in the configuration is invalid."""


@dataclass(frozen=True, slots=True)
class Acl:
    principal: str  # "User:alice" or "User:*"
    operation: str
    resource_type: str
    resource_name: str  # a name, or "*"
    pattern_type: str = "literal"
    permission: str = "allow"
    host: str = "*"

    def matches(self, principal: str, host: str, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.principal not in (principal, "User:*"):
            return False
        if self.host not in ("*", host):
            return False
        if self.pattern_type == "prefixed":
            return name.startswith(self.resource_name)
        return self.resource_name in ("*", name)

    def covers(self, operation: str) -> bool:
        return self.operation in ("All", operation) or (
            self.permission == "allow" and self.operation in _IMPLIED_BY.get(operation, ())
        )


def parse_acl(entry: Mapping[str, Any]) -> Acl:
    """One ACL from a config table: principal, operation, resource_type, resource_name, and
    optionally pattern_type (literal|prefixed), permission (allow|deny), host."""
    resource_type = str(entry.get("resource_type", ""))
    try:
        acl = Acl(
            principal=str(entry["principal"]),
            operation=str(entry["operation"]),
            resource_type=str(entry["resource_type"]),
            # Only the Cluster resource has a name to take for granted.
            resource_name=str(
                entry["resource_name"]
                if resource_type != "Cluster"
                else entry.get("resource_name", CLUSTER_RESOURCE)
            ),
            pattern_type=str(entry.get("pattern_type", "literal")).lower(),
            permission=str(entry.get("permission", "allow")).lower(),
            host=str(entry.get("host", "*")),
        )
    except KeyError as e:
        raise AclError(f"ACL {dict(entry)} lacks {e.args[0]!r}") from None
    unknown = set(entry) - {
        "principal",
        "operation",
        "resource_type",
        "resource_name",
        "pattern_type",
        "permission",
        "host",
    }
    supported = SUPPORTED_OPERATIONS.get(acl.resource_type, set())
    problems = [
        (
            not acl.principal.startswith("User:") or acl.principal == "User:",
            f"principal {acl.principal!r} is not User:NAME",
        ),
        (
            acl.operation not in OPERATIONS,
            f"operation {acl.operation!r} is not one of {OPERATIONS}",
        ),
        (
            acl.resource_type not in RESOURCE_TYPES,
            f"resource_type {acl.resource_type!r} is not one of {RESOURCE_TYPES}",
        ),
        (acl.pattern_type not in PATTERN_TYPES, f"pattern_type {acl.pattern_type!r}"),
        (acl.permission not in PERMISSIONS, f"permission {acl.permission!r}"),
        (bool(unknown), f"unknown keys {sorted(unknown)}"),
        (
            acl.resource_type in SUPPORTED_OPERATIONS
            and acl.operation in OPERATIONS
            and acl.operation != "All"
            and acl.operation not in supported,
            f"operation {acl.operation} does not apply to {acl.resource_type} "
            f"(one of {sorted(supported)} or All)",
        ),
        (
            acl.resource_name == "",
            "resource_name is empty (a prefix of nothing would match "
            'everything; use "*" for every name)',
        ),
        (
            acl.resource_name == "*" and acl.pattern_type == "prefixed",
            '"*" is a literal wildcard, not a prefix',
        ),
        (
            acl.resource_type == "Cluster" and acl.resource_name != CLUSTER_RESOURCE,
            f"the Cluster resource is named {CLUSTER_RESOURCE!r}",
        ),
        (acl.host == "", 'host is empty ("*" for any host)'),
    ]
    for bad, message in problems:
        if bad:
            raise AclError(f"ACL {dict(entry)}: {message}")
    return acl


class Authorizer:
    """Answers "may this principal do this?"; ``enabled=False`` allows everything (Kafka with
    no authorizer configured)."""

    def __init__(
        self, acls: Iterable[Acl] = (), super_users: Iterable[str] = (), enabled: bool = False
    ) -> None:
        self.acls = tuple(acls)
        self.super_users = frozenset(super_users)
        self.enabled = enabled

    def authorize(
        self, principal: str, operation: str, resource_type: str, name: str, host: str = "*"
    ) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        matching = [a for a in self.acls if a.matches(principal, host, resource_type, name)]
        if any(a.permission == "deny" and a.covers(operation) for a in matching):
            return False
        return any(a.permission == "allow" and a.covers(operation) for a in matching)

    def authorize_any(self, principal: str, operation: str, resource_type: str, host: str) -> bool:
        """Whether ``principal`` may do ``operation`` on some resource of ``resource_type``
        (Kafka's ``Authorizer.authorizeByResourceType``, which lets an idempotent producer in
        with Write on any topic, KIP-679): allowed if a name would be (a super user, or ``*``),
        else if some ALLOW names a resource (literal or prefix) that no DENY of the same
        literal name or of a prefix of it takes back. Only ``operation`` itself or All
        counts, as in Kafka: an implied operation does not."""
        if self.authorize(principal, operation, resource_type, "hardcode", host):
            return True
        allowed: list[Acl] = []
        denied_literals: set[str] = set()
        denied_prefixes: set[str] = set()
        for acl in self.acls:
            if (
                acl.resource_type != resource_type
                or acl.principal not in (principal, "User:*")
                or acl.host not in ("*", host)
                or acl.operation not in (operation, "All")
            ):
                continue
            if acl.permission == "allow":
                allowed.append(acl)
            elif acl.pattern_type == "prefixed":
                denied_prefixes.add(acl.resource_name)
            elif acl.resource_name == "*":
                return False  # a DENY of every name beats any ALLOW
            else:
                denied_literals.add(acl.resource_name)
        if any(a.resource_name == "*" and a.pattern_type == "literal" for a in allowed):
            return True
        return any(
            not (acl.pattern_type == "literal" and acl.resource_name in denied_literals)
            and not any(
                acl.resource_name[:end] in denied_prefixes
                for end in range(1, len(acl.resource_name) + 1)
            )
            for acl in allowed
        )
