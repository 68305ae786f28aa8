"""Kafka's rules for the names a Metadata or FindCoordinator request carries, pure: topic
names (``org.apache.kafka.common.internals.Topic``), share-partition keys
(``SharePartitionKey.getInstance(String)``), the operations a principal may do on a resource
(``AuthHelper.authorizedOperations``) and the order Kafka's answers list a set of names in
(``java.util.HashSet``'s)."""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from pidctl.controller.core.acl import SUPPORTED_OPERATIONS, Authorizer

#: Topic.INTERNAL_TOPICS: a Metadata answer marks them internal whether they exist or not.
INTERNAL_TOPICS: Final = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state"}
)
#: Topic.MAX_NAME_LENGTH (in UTF-16 code units, as Java counts).
MAX_TOPIC_NAME_LENGTH: Final = 249
_LEGAL_NAME: Final = re.compile(r"[a-zA-Z0-9._-]*")
#: Uuid.fromString refuses a string longer than this before decoding it.
_MAX_UUID_STRING: Final = 24
_BASE64_URL: Final = re.compile(r"[A-Za-z0-9_-]*=*")
#: Java's Integer.parseInt: an optional sign, then ASCII digits, within an int.
_JAVA_INT: Final = re.compile(r"[+-]?[0-9]+")
_INT32: Final = range(-(2**31), 2**31)

#: AclOperation codes, for the bit fields of authorized operations (Utils.to32BitField).
ACL_OPERATION_CODES: Final = {
    "Read": 3,
    "Write": 4,
    "Create": 5,
    "Delete": 6,
    "Alter": 7,
    "Describe": 8,
    "ClusterAction": 9,
    "DescribeConfigs": 10,
    "AlterConfigs": 11,
    "IdempotentWrite": 12,
}
#: The field's default (Integer.MIN_VALUE): "not asked for".
AUTHORIZED_OPERATIONS_NOT_REQUESTED: Final = -(2**31)


def invalid_topic_name(name: str) -> str | None:
    """Why Kafka's Topic.validate refuses ``name`` (INVALID_TOPIC_EXCEPTION), or None."""
    if name == "":
        return "the empty string is not allowed"
    if name in (".", ".."):
        return f"'{name}' is not allowed"
    if _java_length(name) > MAX_TOPIC_NAME_LENGTH:
        return f"the length of '{name}' is longer than the max allowed length 249"
    if not _LEGAL_NAME.fullmatch(name) or not name.isascii():
        return f"'{name}' contains one or more characters other than ASCII alphanumerics"
    return None


def is_internal_topic(name: str) -> bool:
    """Topic.isInternal: one of Kafka's own topics, whether it exists or not."""
    return name in INTERNAL_TOPICS


def is_share_partition_key(key: str) -> bool:
    """Whether SharePartitionKey.getInstance(String) takes ``key``: ``group:topicId:partition``
    with a group that is not blank (it may hold colons), a topic id as Uuid.fromString
    reads it (URL-safe base64 of 16 bytes) and a partition as Integer.parseInt reads it.
    Java's String.split drops trailing empty parts, so ``g:id:0:`` is taken too."""
    parts = key.split(":")
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 3:
        return False
    group, topic_id, partition = ":".join(parts[:-2]), parts[-2], parts[-1]
    return bool(group.strip()) and _is_uuid_string(topic_id) and _is_java_int(partition)


def _is_uuid_string(text: str) -> bool:
    if len(text) > _MAX_UUID_STRING or not _BASE64_URL.fullmatch(text):
        return False
    try:
        decoded = base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        return False
    return len(decoded) == 16


def _is_java_int(text: str) -> bool:
    return bool(_JAVA_INT.fullmatch(text)) and int(text) in _INT32


def authorized_operations(
    authorizer: Authorizer, principal: str, host: str, resource_type: str, name: str
) -> int:
    """AuthHelper.authorizedOperations: the bit field of the operations ``principal`` may do
    on the resource, of those an ACL on its type may name (every one without an
    authorizer)."""
    field = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if authorizer.authorize(principal, operation, resource_type, name, host):
            field |= 1 << ACL_OPERATION_CODES[operation]
    return field


# -- Kafka's order of a set of names ---------------------------------------------------------

T = TypeVar("T")
#: java.util.HashMap's first table size and load factor.
_FIRST_TABLE: Final = 16
_LOAD_FACTOR: Final = 0.75


def java_string_hash(text: str) -> int:
    """String.hashCode: over UTF-16 code units, as a signed 32-bit int."""
    units = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(units), 2):
        value = (31 * value + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def java_uuid_hash(value: uuid.UUID) -> int:
    """org.apache.kafka.common.Uuid.hashCode: the two halves' xor, folded to 32 bits."""
    folded = (value.int >> 64) ^ (value.int & 0xFFFFFFFFFFFFFFFF)
    return ((folded >> 32) ^ folded) & 0xFFFFFFFF


def java_hash_set_order(items: Iterable[T], hash_of: Callable[[T], int]) -> list[T]:
    """``items`` without repeats, in the order a java.util.HashSet filled one by one iterates
    them: by bucket (the spread hash's low bits), each bucket in insertion order. (A bucket
    of eight or more in a table of 64 or more becomes a tree in Java, whose order this does
    not follow: no request pidctl serves names that many colliding topics.)"""
    unique = list(dict.fromkeys(items))
    table = _FIRST_TABLE
    while len(unique) > table * _LOAD_FACTOR:
        table *= 2
    mask = table - 1

    def bucket(item: T) -> int:
        h = hash_of(item) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & mask

    return sorted(unique, key=bucket)  # (stable: a bucket keeps insertion order)


def _java_length(text: str) -> int:
    return len(text.encode("utf-16-be")) // 2
