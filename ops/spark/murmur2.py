"""Kafka's default partitioner for a whole Arrow column of keys at once: murmur2 of each key
(Kafka's ``Utils.murmur2``, 32-bit, seed 0x9747b28c), made positive, modulo the partition
count — the partition the Java client (and Spark's Kafka sink) picks for a keyed record.

Computed with numpy, one pass per distinct key length over every key of that length, instead
of a Python loop per key (kafka-python's ``murmur2`` costs a few microseconds a key, as much
as building the record itself). ``tests/ops/spark/test_murmur2.py`` checks it against
kafka-python's function.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)


def _hash_rows(rows: Any, length: int) -> Any:
    """murmur2 of every row of ``rows`` (an n x length uint8 matrix), as uint32."""
    h = np.full(rows.shape[0], (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    words = rows[:, : length - length % 4].astype(np.uint32)
    for i in range(0, length - length % 4, 4):
        k = words[:, i] | (words[:, i + 1] << 8) | (words[:, i + 2] << 16) | (words[:, i + 3] << 24)
        k *= _M
        k ^= k >> np.uint32(24)
        k *= _M
        h *= _M
        h ^= k
    base, tail = length & ~3, length % 4
    if tail >= 3:
        h ^= rows[:, base + 2].astype(np.uint32) << np.uint32(16)
    if tail >= 2:
        h ^= rows[:, base + 1].astype(np.uint32) << np.uint32(8)
    if tail >= 1:
        h ^= rows[:, base].astype(np.uint32)
        h *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def partitions_of(keys: Any, count: int) -> Any:
    """The partition of each key of a pyarrow string or binary array, as a numpy int64
    array: -1 for a null key."""
    import pyarrow as pa

    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    partitions = np.full(n, -1, dtype=np.int64)
    if n == 0 or keys.null_count == n:
        return partitions
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset : keys.offset + n + 1]
    data = np.frombuffer(keys.buffers()[2] or b"", dtype=np.uint8)
    lengths = np.diff(offsets)
    valid = np.ones(n, dtype=bool)
    if keys.null_count:
        valid = ~np.asarray(keys.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    for length in np.unique(lengths[valid]):
        rows = np.nonzero(valid & (lengths == length))[0]
        matrix = data[offsets[rows][:, None] + np.arange(int(length))]
        hashed = _hash_rows(matrix.reshape(len(rows), int(length)), int(length))
        partitions[rows] = (hashed & np.uint32(0x7FFFFFFF)).astype(np.int64) % count
    return partitions


def key_partitions(keys: Any, count: int) -> list[int | None]:
    """The partition of each key of a pyarrow binary array (None for a null key)."""
    return [None if p < 0 else p for p in partitions_of(keys, count).tolist()]
