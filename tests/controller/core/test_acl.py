from __future__ import annotations

import pytest

from pidctl.controller.core.acl import (
    SUPPORTED_OPERATIONS,
    Acl,
    AclError,
    Authorizer,
    parse_acl,
)
from pidctl.controller.core.kafka import CLUSTER_RESOURCE as CLUSTER


def test_no_authorizer_allows_everything() -> None:
    assert Authorizer().authorize("User:anyone", "ClusterAction", "Cluster", CLUSTER)


def test_no_matching_acl_is_denied() -> None:
    assert not Authorizer(enabled=True).authorize("User:a", "Write", "TransactionalId", "tx")


def test_literal_prefixed_and_wildcard() -> None:
    authorizer = Authorizer(
        [
            Acl("User:a", "Write", "TransactionalId", "orders"),
            Acl("User:b", "Write", "TransactionalId", "app-", "prefixed"),
            Acl("User:*", "Write", "TransactionalId", "shared"),
            Acl("User:c", "Write", "TransactionalId", "*"),
        ],
        enabled=True,
    )
    can = authorizer.authorize
    assert can("User:a", "Write", "TransactionalId", "orders")
    assert not can("User:a", "Write", "TransactionalId", "orders-2")
    assert can("User:b", "Write", "TransactionalId", "app-1")
    assert not can("User:b", "Write", "TransactionalId", "ap")
    assert can("User:z", "Write", "TransactionalId", "shared")
    assert can("User:c", "Write", "TransactionalId", "anything")
    assert not can("User:c", "Write", "Cluster", CLUSTER)


def test_deny_beats_allow_and_super_users_beat_deny() -> None:
    authorizer = Authorizer(
        [
            Acl("User:*", "All", "TransactionalId", "*"),
            Acl("User:bad", "Write", "TransactionalId", "pay", "prefixed", "deny"),
        ],
        super_users=["User:admin"],
        enabled=True,
    )
    assert authorizer.authorize("User:good", "Write", "TransactionalId", "payments")
    assert not authorizer.authorize("User:bad", "Write", "TransactionalId", "payments")
    assert authorizer.authorize("User:bad", "Write", "TransactionalId", "orders")
    assert authorizer.authorize("User:admin", "ClusterAction", "Cluster", CLUSTER)


def test_describe_is_implied_by_write_but_cluster_action_implies_nothing() -> None:
    authorizer = Authorizer(
        [
            Acl("User:a", "Write", "TransactionalId", "tx"),
            Acl("User:b", "ClusterAction", "Cluster", CLUSTER),
        ],
        enabled=True,
    )
    assert authorizer.authorize("User:a", "Describe", "TransactionalId", "tx")
    assert not authorizer.authorize("User:b", "Describe", "Cluster", CLUSTER)
    assert not authorizer.authorize("User:b", "IdempotentWrite", "Cluster", CLUSTER)


def test_host_restriction() -> None:
    authorizer = Authorizer(
        [Acl("User:a", "ClusterAction", "Cluster", CLUSTER, host="10.0.0.5")], enabled=True
    )
    assert authorizer.authorize("User:a", "ClusterAction", "Cluster", CLUSTER, "10.0.0.5")
    assert not authorizer.authorize("User:a", "ClusterAction", "Cluster", CLUSTER, "10.0.0.6")


def test_parse_acl() -> None:
    acl = parse_acl(
        {
            "principal": "User:a",
            "operation": "Write",
            "resource_type": "TransactionalId",
            "resource_name": "tx-",
            "pattern_type": "PREFIXED",
        }
    )
    assert acl == Acl("User:a", "Write", "TransactionalId", "tx-", "prefixed")
    cluster = parse_acl(
        {"principal": "User:b", "operation": "ClusterAction", "resource_type": "Cluster"}
    )
    assert cluster.resource_name == CLUSTER
    for bad in (
        {"principal": "alice", "operation": "Write", "resource_type": "Cluster"},
        {"principal": "User:a", "operation": "Fly", "resource_type": "Cluster"},
        {"principal": "User:a", "operation": "Write", "resource_type": "Planet"},
        {"principal": "User:a", "operation": "Write"},
        {"principal": "User:a", "operation": "Write", "resource_type": "Cluster", "colour": 1},
    ):
        with pytest.raises(AclError):
            parse_acl(bad)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        # An empty prefix would match every name.
        (
            {"resource_type": "TransactionalId", "resource_name": "", "pattern_type": "prefixed"},
            "resource_name is empty",
        ),
        # A TransactionalId ACL must name its ids (it used to become "kafka-cluster").
        ({"resource_type": "TransactionalId"}, "lacks 'resource_name'"),
        (
            {
                "resource_type": "Group",
                "resource_name": "*",
                "pattern_type": "prefixed",
                "operation": "Read",
            },
            "literal wildcard",
        ),
        ({"resource_type": "Cluster", "resource_name": "other"}, "named 'kafka-cluster'"),
        (
            {
                "resource_type": "TransactionalId",
                "resource_name": "t",
                "operation": "ClusterAction",
            },
            "does not apply to TransactionalId",
        ),
        ({"resource_type": "Cluster", "host": ""}, "host is empty"),
        ({"resource_type": "Cluster", "principal": "User:"}, "is not User:NAME"),
    ],
)
def test_malformed_acls_are_refused_naming_the_entry(entry: dict[str, str], says: str) -> None:
    full = {"principal": "User:a", "operation": "Write", **entry}
    if full["resource_type"] == "Cluster" and "operation" not in entry:
        full["operation"] = "ClusterAction"
    with pytest.raises(AclError, match=says) as refused:
        parse_acl(full)
    assert str(full["resource_type"]) in str(refused.value)  # the entry is named


def test_every_supported_operation_and_all_are_accepted() -> None:
    for resource_type, operations in SUPPORTED_OPERATIONS.items():
        name = CLUSTER if resource_type == "Cluster" else "x"
        for operation in [*operations, "All"]:
            entry = {
                "principal": "User:a",
                "operation": operation,
                "resource_type": resource_type,
                "resource_name": name,
            }
            assert parse_acl(entry).operation == operation


def test_an_app_id_acl_reads_as_a_transactional_ids() -> None:
    """The AppId resource (a named job's app id) takes literal and prefixed names and the
    operations a TransactionalId takes, Write implying Describe."""
    acl = parse_acl(
        {
            "principal": "User:etl",
            "operation": "Write",
            "resource_type": "AppId",
            "resource_name": "nightly-",
            "pattern_type": "prefixed",
        }
    )
    authorizer = Authorizer([acl], enabled=True)
    assert authorizer.authorize("User:etl", "Write", "AppId", "nightly-orders")
    assert authorizer.authorize("User:etl", "Describe", "AppId", "nightly-orders")
    assert not authorizer.authorize("User:etl", "Write", "AppId", "hourly-orders")
    assert not authorizer.authorize("User:etl", "Write", "TransactionalId", "nightly-orders")
    with pytest.raises(AclError, match="does not apply to AppId"):
        parse_acl({**_entry_of(acl), "operation": "IdempotentWrite"})


def _entry_of(acl: Acl) -> dict[str, str]:
    return {
        "principal": acl.principal,
        "operation": acl.operation,
        "resource_type": acl.resource_type,
        "resource_name": acl.resource_name,
        "pattern_type": acl.pattern_type,
    }


def _any_topic(*acls: Acl, host: str = "10.0.0.1", super_users: tuple[str, ...] = ()) -> bool:
    authorizer = Authorizer(acls, super_users, enabled=True)
    return authorizer.authorize_any("User:p", "Write", "Topic", host)


def test_write_on_any_topic_is_asked_as_kafka_asks_it() -> None:
    # Kafka's Authorizer.authorizeByResourceType, case by case.
    deny = "deny"
    assert not _any_topic()
    assert _any_topic(super_users=("User:p",))
    assert _any_topic(Acl("User:p", "Write", "Topic", "orders"))
    assert _any_topic(Acl("User:p", "Write", "Topic", "ord", "prefixed"))
    assert _any_topic(Acl("User:*", "Write", "Topic", "*"))
    assert _any_topic(Acl("User:p", "All", "Topic", "orders"))
    # Only the operation itself or All: Read, and Write on another type, do not count.
    assert not _any_topic(Acl("User:p", "Read", "Topic", "*"))
    assert not _any_topic(Acl("User:p", "Write", "TransactionalId", "*"))
    assert not _any_topic(Acl("User:q", "Write", "Topic", "*"))
    assert not _any_topic(Acl("User:p", "Write", "Topic", "*", host="10.0.0.2"))
    # A DENY takes back the same literal name, or a name under its prefix.
    orders = Acl("User:p", "Write", "Topic", "orders")
    assert not _any_topic(orders, Acl("User:p", "Write", "Topic", "orders", permission=deny))
    assert not _any_topic(
        orders, Acl("User:p", "Write", "Topic", "or", "prefixed", permission=deny)
    )
    assert not _any_topic(
        Acl("User:p", "Write", "Topic", "orders", "prefixed", permission="allow"),
        Acl("User:p", "All", "Topic", "ord", "prefixed", permission=deny),
    )
    # ... but not a longer prefix, another name, or a literal DENY of a prefix ALLOW.
    assert _any_topic(
        orders, Acl("User:p", "Write", "Topic", "orders-", "prefixed", permission=deny)
    )
    assert _any_topic(orders, Acl("User:p", "Write", "Topic", "other", permission=deny))
    assert _any_topic(
        Acl("User:p", "Write", "Topic", "ord", "prefixed"),
        Acl("User:p", "Write", "Topic", "ord", permission=deny),
    )
    # One ALLOW left standing is enough; a DENY of "*" beats every ALLOW, even of "*"; an
    # ALLOW of "*" beats any DENY but that one.
    assert _any_topic(
        orders,
        Acl("User:p", "Write", "Topic", "a"),
        Acl("User:p", "Write", "Topic", "a", permission=deny),
    )
    assert not _any_topic(
        Acl("User:p", "Write", "Topic", "*"), Acl("User:*", "Write", "Topic", "*", permission=deny)
    )
    assert _any_topic(
        Acl("User:p", "Write", "Topic", "*"), Acl("User:p", "Write", "Topic", "x", permission=deny)
    )
    # A super user is let in whatever DENY there is.
    assert _any_topic(
        Acl("User:p", "Write", "Topic", "*", permission=deny), super_users=("User:p",)
    )
