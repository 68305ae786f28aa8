from __future__ import annotations

import pytest

from controller.acl import CLUSTER, Acl, AclError, Authorizer, parse_acl


def test_no_authorizer_allows_everything() -> None:
    assert Authorizer().authorize("User:anyone", "ClusterAction", "Cluster", CLUSTER)


def test_no_matching_acl_is_denied() -> None:
    assert not Authorizer(enabled=True).authorize("User:a", "Write", "TransactionalId", "tx")


def test_literal_prefixed_and_wildcard() -> None:
    authorizer = Authorizer([
        Acl("User:a", "Write", "TransactionalId", "orders"),
        Acl("User:b", "Write", "TransactionalId", "app-", "prefixed"),
        Acl("User:*", "Write", "TransactionalId", "shared"),
        Acl("User:c", "Write", "TransactionalId", "*"),
    ], enabled=True)  # fmt: skip
    can = authorizer.authorize
    assert can("User:a", "Write", "TransactionalId", "orders")
    assert not can("User:a", "Write", "TransactionalId", "orders-2")
    assert can("User:b", "Write", "TransactionalId", "app-1")
    assert not can("User:b", "Write", "TransactionalId", "ap")
    assert can("User:z", "Write", "TransactionalId", "shared")
    assert can("User:c", "Write", "TransactionalId", "anything")
    assert not can("User:c", "Write", "Cluster", CLUSTER)


def test_deny_beats_allow_and_super_users_beat_deny() -> None:
    authorizer = Authorizer([
        Acl("User:*", "All", "TransactionalId", "*"),
        Acl("User:bad", "Write", "TransactionalId", "pay", "prefixed", "deny"),
    ], super_users=["User:admin"], enabled=True)  # fmt: skip
    assert authorizer.authorize("User:good", "Write", "TransactionalId", "payments")
    assert not authorizer.authorize("User:bad", "Write", "TransactionalId", "payments")
    assert authorizer.authorize("User:bad", "Write", "TransactionalId", "orders")
    assert authorizer.authorize("User:admin", "ClusterAction", "Cluster", CLUSTER)


def test_describe_is_implied_by_write_but_cluster_action_implies_nothing() -> None:
    authorizer = Authorizer([
        Acl("User:a", "Write", "TransactionalId", "tx"),
        Acl("User:b", "ClusterAction", "Cluster", CLUSTER),
    ], enabled=True)  # fmt: skip
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
    acl = parse_acl({"principal": "User:a", "operation": "Write",
                     "resource_type": "TransactionalId", "resource_name": "tx-",
                     "pattern_type": "PREFIXED"})  # fmt: skip
    assert acl == Acl("User:a", "Write", "TransactionalId", "tx-", "prefixed")
    cluster = parse_acl({"principal": "User:b", "operation": "ClusterAction",
                         "resource_type": "Cluster"})  # fmt: skip
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
