"""Kafka's rules for topic names, share-partition keys, authorized operations and the order
of a set of names (controller/core/topics.py). The answers these give are compared with a
running Kafka by the conformance corpus (metadata-topic-names, find-coordinator-share)."""

from __future__ import annotations

import uuid

import pytest

from pidctl.controller.core.acl import Acl, Authorizer
from pidctl.controller.core.topics import (
    authorized_operations,
    invalid_topic_name,
    is_internal_topic,
    is_share_partition_key,
    java_hash_set_order,
    java_string_hash,
    java_uuid_hash,
)

ZERO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Uuid.fromString of 22 base64 characters: 16 bytes


@pytest.mark.parametrize("name", ["", ".", "..", "bad name!", "x" * 250, "caf\u00e9", "a/b"])
def test_names_kafka_refuses(name: str) -> None:
    assert invalid_topic_name(name) is not None


@pytest.mark.parametrize("name", ["a", "a..b", "...", "x" * 249, "A-Z_0.9", "__consumer_offsets"])
def test_names_kafka_takes(name: str) -> None:
    assert invalid_topic_name(name) is None


def test_internal_topics_are_krafts_three() -> None:
    assert all(
        map(is_internal_topic, ["__consumer_offsets", "__transaction_state", "__share_group_state"])
    )
    assert not is_internal_topic("__cluster_metadata")  # not in Topic.INTERNAL_TOPICS


@pytest.mark.parametrize(
    ("key", "taken"),
    [
        (f"g:{ZERO_ID}:0", True),
        (f"g:{ZERO_ID}:-1", True),  # Integer.parseInt takes a sign
        (f"g:{ZERO_ID}:+7", True),
        (f"a:b:{ZERO_ID}:0", True),  # the group is everything before the last two parts
        (f"g:{ZERO_ID}:0:", True),  # String.split drops trailing empty parts
        (f"g:{ZERO_ID}==:0", True),  # padded base64, 24 characters
        ("g", False),
        (f"g:{ZERO_ID}", False),
        (f":{ZERO_ID}:0", False),  # empty group
        (f" :{ZERO_ID}:0", False),  # blank group (trimmed)
        ("g:not-a-uuid:0", False),
        (f"g:{ZERO_ID}A:0", False),  # 17 bytes and a bit
        (f"g:{ZERO_ID}:x", False),
        (f"g:{ZERO_ID}:2147483648", False),  # beyond an int
        (f"g:{ZERO_ID}:0:1", False),  # "0" is then the topic id
        ("", False),
    ],
)
def test_share_partition_keys(key: str, taken: bool) -> None:
    assert is_share_partition_key(key) is taken


def test_authorized_operations_without_an_authorizer_are_every_supported_one() -> None:
    # The bit fields a Kafka 4.4 without an authorizer answers (recorded in metadata goldens).
    everyone = Authorizer()
    assert authorized_operations(everyone, "User:a", "*", "Topic", "t") == 3576
    assert authorized_operations(everyone, "User:a", "*", "Cluster", "kafka-cluster") == 8096


def test_authorized_operations_follow_the_acls() -> None:
    acls = [Acl("User:a", "Read", "Topic", "t")]
    authorizer = Authorizer(acls, enabled=True)
    # Read, and Describe that Read implies.
    assert authorized_operations(authorizer, "User:a", "*", "Topic", "t") == 1 << 3 | 1 << 8
    assert authorized_operations(authorizer, "User:b", "*", "Topic", "t") == 0


def test_java_hashes() -> None:
    assert java_string_hash("a") == 97
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("polygenelubricants") == -(2**31)  # wraps as a Java int
    assert java_uuid_hash(uuid.UUID(int=7)) == 7


def test_a_set_of_names_in_kafkas_order() -> None:
    # As Kafka 4.4 listed them (a java.util.HashSet's order), once each.
    assert java_hash_set_order(["b", "a", "c", "a"], java_string_hash) == ["a", "b", "c"]
    names = ["t5", "t1", "t3", "t2", "t4", "t0"]
    assert java_hash_set_order(names, java_string_hash) == ["t4", "t5", "t0", "t1", "t2", "t3"]
