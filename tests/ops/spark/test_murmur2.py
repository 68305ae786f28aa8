"""The vectorised partitioner is Kafka's: the same partition as kafka-python's murmur2 (a port
of Kafka's Utils.murmur2) for any keys, lengths, nulls and slices."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2

from pidctl.spark.murmur2 import key_partitions


def _kafka(key: bytes | None, count: int) -> int | None:
    return None if key is None else (murmur2(key) & 0x7FFFFFFF) % count


@given(
    keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60),
    count=st.integers(1, 1000),
    skip=st.integers(0, 5),
)
def test_same_partition_as_kafka(keys: list[bytes | None], count: int, skip: int) -> None:
    column = pa.array(keys, pa.binary()).slice(min(skip, len(keys)))
    expected = [_kafka(k, count) for k in keys[min(skip, len(keys)) :]]
    assert key_partitions(column, count) == expected


def test_string_keys_are_their_utf8_bytes() -> None:
    keys = ["order-1", "zoë", "", "键"]
    assert key_partitions(pa.array(keys), 12) == [_kafka(k.encode(), 12) for k in keys]


def test_known_java_values() -> None:
    """Kafka's own UtilsTest: murmur2 of these strings."""
    cases = {"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536}
    for text, value in cases.items():
        assert key_partitions(pa.array([text]), 2**31 - 1) == [(value & 0x7FFFFFFF) % (2**31 - 1)]
