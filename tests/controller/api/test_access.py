"""What every handler asks (access.py): may the principal, as Kafka's authorizer answers,
and the one authorizer and pause every handler sees, replaced in one place."""

from __future__ import annotations

from pidctl.controller.api.access import Access, ConnectionInfo
from pidctl.controller.core.acl import Acl, Authorizer

ALICE = ConnectionInfo(principal="User:alice", host="10.0.0.1")


def _told_nobody(api: str) -> None:
    """No one is told."""


def test_without_an_authorizer_every_principal_may_everything() -> None:
    access = Access(Authorizer(), _told_nobody)
    assert access.may(ALICE, "ClusterAction")
    assert access.may(ALICE, "Write", "TransactionalId", "tx")
    assert access.may_write_idempotently(ALICE)


def test_an_operation_is_asked_of_the_cluster_unless_a_resource_is_named() -> None:
    acls = [Acl("User:alice", "ClusterAction", "Cluster", "kafka-cluster")]
    access = Access(Authorizer(acls, enabled=True), _told_nobody)
    assert access.may(ALICE, "ClusterAction")
    assert not access.may(ALICE, "ClusterAction", "Topic", "kafka-cluster")
    assert not access.may(ConnectionInfo(principal="User:bob"), "ClusterAction")


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic() -> None:
    """KIP-679, as Kafka asks it: IdempotentWrite on the cluster, or else Write on any
    topic (a prefix is enough)."""
    nothing = Access(Authorizer([], enabled=True), _told_nobody)
    assert not nothing.may_write_idempotently(ALICE)
    cluster = [Acl("User:alice", "IdempotentWrite", "Cluster", "kafka-cluster")]
    assert Access(Authorizer(cluster, enabled=True), _told_nobody).may_write_idempotently(ALICE)
    topic = [Acl("User:alice", "Write", "Topic", "orders-", pattern_type="prefixed")]
    assert Access(Authorizer(topic, enabled=True), _told_nobody).may_write_idempotently(ALICE)


def test_a_new_authorizer_is_asked_from_the_next_request_on() -> None:
    """A reload replaces the one authorizer every handler asks."""
    access = Access(Authorizer(), _told_nobody)
    assert access.may(ALICE, "ClusterAction")
    access.authorizer = Authorizer([], enabled=True)
    assert not access.may(ALICE, "ClusterAction")
    assert access.paused is None
