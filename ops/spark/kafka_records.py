"""Kafka record batches (magic 2) built from Arrow columns a whole column at a time, and the
fingerprint of a producer's rows.

A record of a v2 batch is ``length, attributes, timestampDelta, offsetDelta, keyLength, key,
valueLength, value, headerCount, headers`` (Kafka's ``DefaultRecord``; the lengths and
deltas zig-zag varints, -1 for a null key or value). The rows of one batch share its
timestamp (every delta 0). Rather than appending one record after another in Python, a
slice of rows is encoded with numpy and Arrow kernels: each record's varints are laid out
in a small matrix whose used bytes, read row by row, are its prefix; Arrow's
``binary_join_element_wise`` then joins prefix, key, value and suffix row by row into one
buffer, the records back to back. About 0.1-0.2 µs a row, where kafka-python's builder took
20 µs and aiokafka's compiled one about 3 µs (``docs/design-decisions.md``).

**Fingerprint.** A row's canonical bytes are its record from ``keyLength`` on (key, value and
headers, nothing that depends on where in a batch it is). The fingerprint of a producer's
rows in a partition, sequences 0 to *s*, is the CRC-32C of their canonical bytes one after
the other: computed a batch at a time (:func:`crc32c` goes on from the previous value), so
any prefix's fingerprint is known without keeping the rows. Every batch carries, in a
header of its first record (:data:`FINGERPRINT_HEADER`), the fingerprint through its last
row: a later run reads it to check that its rows are the ones already written
(``kafka_sink.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

#: Record batch format v2 (magic 2), the one that carries PID, epoch and sequence.
MAGIC = 2
#: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
#: baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, records count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
#: Bytes of the header before ``attributes``: the CRC covers what follows them.
CRC_START = 21
#: ``batchLength`` counts from ``partitionLeaderEpoch`` on.
LENGTH_START = 12
#: The header a batch's first record carries: ``v1 <partitions> <fingerprint> <started>
#: <version> <app id>`` (:class:`Stamp`; ``docs/spark-kafka.md``).
FINGERPRINT_HEADER = "pidctl.fp"
FINGERPRINT_FORMAT = "v1"
#: The most bytes of a zig-zag varint of a 32-bit value.
VARINT_BYTES = 5


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's zig-zag varint (Kafka's ``ByteUtils.sizeOfVarint``)."""
    zz = _zigzag(values)
    size = np.ones(len(zz), dtype=np.int64)
    for shift in (7, 14, 21, 28, 35, 42, 49, 56, 63):
        size += zz >= np.uint64(1 << shift)
    return size


def _binary(rows: int, sizes: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.BinaryArray.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


class _Fields:
    """Rows of fixed-width fields, each holding a varint (or a fixed byte) in its first so
    many bytes: the used bytes, read row by row, are each row's encoding."""

    def __init__(self, rows: int, width: int) -> None:
        self.matrix = np.zeros((rows, width), dtype=np.uint8)
        self.used = np.zeros((rows, width), dtype=bool)
        self.sizes = np.zeros(rows, dtype=np.int64)

    def varints(self, column: int, values: np.ndarray) -> None:
        """Each value's zig-zag varint in columns ``column`` to ``column + 4``."""
        zz = _zigzag(values)
        sizes = varint_sizes(values)
        for k in range(VARINT_BYTES):
            low = (zz >> np.uint64(7 * k)) & np.uint64(0x7F)
            more = (sizes > k + 1).astype(np.uint64) << np.uint64(7)
            self.matrix[:, column + k] = (low | more).astype(np.uint8)
        self.used[:, column : column + VARINT_BYTES] = np.arange(VARINT_BYTES) < sizes[:, None]
        self.sizes += sizes

    def zero(self, column: int) -> None:
        """A byte 0 in ``column`` of every row (attributes, a timestamp delta of 0)."""
        self.used[:, column] = True
        self.sizes += 1

    def binary(self) -> pa.Array:
        """Each row's used bytes as one binary value."""
        return _binary(len(self.sizes), self.sizes, self.matrix[self.used])


def lengths(column: pa.Array) -> np.ndarray:
    """Each value's length in bytes, -1 for null."""
    sizes = pc.binary_length(column).fill_null(-1)
    return np.asarray(sizes, dtype=np.int64)


def as_binary(column: pa.Array) -> pa.Array:
    """A string or binary column as binary (a view: the same bytes)."""
    if pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        column = column.cast(pa.large_binary())
        return column.cast(pa.binary())
    if pa.types.is_string(column.type):
        return column.view(pa.binary())
    return column


def header_bytes(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """A record's ``headerCount`` and headers (a header's key a string, its value bytes or
    None)."""
    out = bytearray(_varint(len(headers)))
    for key, value in headers:
        name = key.encode()
        out += _varint(len(name)) + name
        if value is None:
            out += _varint(-1)
        else:
            out += _varint(len(value)) + value
    return bytes(out)


def _varint(value: int) -> bytes:
    zz = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Canonical:
    """Rows' canonical bytes (key, value, headers: :mod:`this module's doc <kafka_records>`),
    one Arrow binary value per row."""

    rows: pa.Array

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, start: int, stop: int) -> Canonical:
        return Canonical(self.rows.slice(start, stop - start))

    def sizes(self) -> np.ndarray:
        return lengths(self.rows)

    def fingerprint(self, previous: int) -> int:
        """The fingerprint through these rows, going on from ``previous`` (0: none before)."""
        if not len(self.rows):
            return previous
        return int(crc32c(memoryview(_contiguous(self.rows)), previous))


def _contiguous(rows: pa.Array) -> pa.Buffer:
    """The bytes of ``rows``' values back to back (a binary array without nulls)."""
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32)[
        rows.offset : rows.offset + len(rows) + 1
    ]
    return rows.buffers()[2][int(offsets[0]) : int(offsets[-1])]


def canonical(
    keys: pa.Array | None, values: pa.Array, headers: list[bytes] | None = None
) -> Canonical:
    """The canonical bytes of each row: ``keyLength, key, valueLength, value`` and the
    headers (``headers``: each row's :func:`header_bytes`; None: no headers)."""
    rows = len(values)
    values = as_binary(values)
    value_lengths = lengths(values)
    if keys is None:
        key_lengths = np.full(rows, -1, dtype=np.int64)
        keys = pa.nulls(rows, pa.binary())
    else:
        keys = as_binary(keys)
        key_lengths = lengths(keys)
    key_prefix, value_prefix = _Fields(rows, VARINT_BYTES), _Fields(rows, VARINT_BYTES)
    key_prefix.varints(0, key_lengths)
    value_prefix.varints(0, value_lengths)
    if headers is None:
        suffix: Any = pa.scalar(b"\x00", pa.binary())  # headerCount 0
    else:
        suffix = pa.array(headers, pa.binary())
    joined = pc.binary_join_element_wise(
        key_prefix.binary(),
        keys.fill_null(b""),
        value_prefix.binary(),
        values.fill_null(b""),
        suffix,
        pa.scalar(b"", pa.binary()),
    )
    return Canonical(joined)


def records(rows: Canonical, first_offset_delta: int) -> pa.Buffer:
    """The records of ``rows`` back to back (attributes 0, timestamp delta 0), offset deltas
    from ``first_offset_delta`` on."""
    count = len(rows)
    deltas = np.arange(first_offset_delta, first_offset_delta + count, dtype=np.int64)
    # length, attributes 0, timestampDelta 0, offsetDelta; then the canonical bytes.
    body = 2 + varint_sizes(deltas) + rows.sizes()
    fields = _Fields(count, 2 * VARINT_BYTES + 2)
    fields.varints(0, body)
    fields.zero(VARINT_BYTES)
    fields.zero(VARINT_BYTES + 1)
    fields.varints(VARINT_BYTES + 2, deltas)
    joined = pc.binary_join_element_wise(fields.binary(), rows.rows, pa.scalar(b"", pa.binary()))
    return _contiguous(joined)


def record(row: bytes, offset_delta: int) -> bytes:
    """One record of canonical bytes ``row`` (attributes 0, timestamp delta 0)."""
    body = b"\x00\x00" + _varint(offset_delta) + row
    return _varint(len(body)) + body


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a batch's :data:`FINGERPRINT_HEADER` says: the topic's partition count the
    writer saw, the fingerprint through the batch's last row, when the job version's first
    run started (Unix ms), and the version's name (-1 and "" for a run without one)."""

    partitions: int
    fingerprint: int
    started_ms: int
    version: int = -1
    app_id: str = ""

    def header(self) -> tuple[str, bytes]:
        fields = (FINGERPRINT_FORMAT, self.partitions, self.fingerprint, self.started_ms)
        value = " ".join(map(str, (*fields, self.version))) + " " + self.app_id
        return FINGERPRINT_HEADER, value.encode()

    @classmethod
    def read(cls, value: bytes | None) -> Stamp | None:
        """The stamp of a header value; None if it is not one this code wrote."""
        parts = (value or b"").split(b" ", 5)
        if len(parts) != 6 or parts[0] != FINGERPRINT_FORMAT.encode():
            return None
        try:
            partitions, fingerprint, started, version = (int(part) for part in parts[1:5])
            return cls(partitions, fingerprint, started, version, parts[5].decode())
        except (ValueError, UnicodeDecodeError):
            return None


def first_record(row: bytes, header: tuple[str, bytes]) -> bytes:
    """The canonical bytes of a batch's first row with ``header`` added to its headers (the
    fingerprint covers the row without it)."""
    key_end = _varint_end(row, 0)
    key_length = _read_varint(row, 0)
    value_at = key_end + max(key_length, 0)
    value_end = _varint_end(row, value_at)
    value_length = _read_varint(row, value_at)
    headers_at = value_end + max(value_length, 0)
    count = _read_varint(row, headers_at)
    rest = row[_varint_end(row, headers_at) :]
    name, value = header
    encoded = name.encode()
    extra = _varint(len(encoded)) + encoded + _varint(len(value)) + value
    return row[:headers_at] + _varint(count + 1) + rest + extra


def _read_varint(data: bytes, at: int) -> int:
    shift = result = 0
    while True:
        byte = data[at]
        result |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1)


def _varint_end(data: bytes, at: int) -> int:
    while data[at] & 0x80:
        at += 1
    return at + 1


def batch(
    parts: list[Any],
    count: int,
    *,
    producer_id: int,
    epoch: int,
    base_sequence: int,
    timestamp_ms: int,
    compression: int = 0,
) -> list[Any]:
    """A whole record batch around ``count`` encoded records given in ``parts`` (bytes-like,
    back to back), as parts: its header, then the records (compressed with ``compression``,
    a :data:`COMPRESSION` id, when that makes them smaller; else not copied)."""
    attributes = 0
    if compression:
        plain = b"".join(bytes(memoryview(part)) for part in parts)
        packed = compress(compression, plain)
        if len(packed) < len(plain):
            parts, attributes = [packed], compression
    size = sum(memoryview(part).nbytes for part in parts)
    header = bytearray(
        BATCH_HEADER.pack(
            0,
            BATCH_HEADER.size - LENGTH_START + size,
            -1,
            MAGIC,
            0,
            attributes,
            count - 1,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            epoch,
            base_sequence,
            count,
        )
    )
    crc = crc32c(memoryview(header)[CRC_START:])
    for part in parts:
        crc = crc32c(memoryview(part), crc)
    struct.pack_into(">I", header, 17, crc)
    return [bytes(header), *parts]


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed as Kafka's ``codec`` (aiokafka's codecs, cramjam's for three)."""
    from aiokafka import codec as codecs

    encode = {
        1: codecs.gzip_encode,
        2: codecs.snappy_encode,
        3: codecs.lz4_encode,
        4: codecs.zstd_encode,
    }[codec]
    return bytes(encode(data))


# -- reading batches back ------------------------------------------------------------------

#: Attributes: the codec's bits, the transactional and the control flag.
_CODEC_MASK, _TRANSACTIONAL, _CONTROL = 0x07, 0x10, 0x20


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch read back."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> bytes | None:
        """The value of the first header called ``name`` (None if there is none)."""
        return next((value for key, value in self.headers if key == name), None)

    def canonical(self) -> bytes:
        """The row's canonical bytes (without the sink's own header): what its fingerprint
        covers."""
        headers = [(k, v) for k, v in self.headers if k != FINGERPRINT_HEADER]
        out = bytearray()
        for part in (self.key, self.value):
            out += _varint(-1 if part is None else len(part))
            out += part or b""
        return bytes(out) + header_bytes(headers)


@dataclass(frozen=True, slots=True)
class BatchView:
    """A record batch read back from a partition: its header, its records on demand."""

    base_offset: int
    last_offset_delta: int
    producer_id: int
    epoch: int
    base_sequence: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    count: int
    data: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.last_offset_delta

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    def records(self) -> list[Record]:
        """The batch's records (decompressed)."""
        body = self.data[BATCH_HEADER.size :]
        codec = self.attributes & _CODEC_MASK
        if codec:
            body = decompress(codec, body)
        out, at = [], 0
        for _ in range(self.count):
            length, at = _read_varint_at(body, at)
            end = at + length
            at += 1  # attributes
            timestamp_delta, at = _read_varint_at(body, at)
            offset_delta, at = _read_varint_at(body, at)
            key, at = _read_bytes(body, at)
            value, at = _read_bytes(body, at)
            header_count, at = _read_varint_at(body, at)
            headers = []
            for _ in range(header_count):
                name, at = _read_bytes(body, at)
                header_value, at = _read_bytes(body, at)
                headers.append(((name or b"").decode(), header_value))
            out.append(
                Record(
                    self.base_offset + offset_delta,
                    self.base_timestamp + timestamp_delta,
                    key,
                    value,
                    tuple(headers),
                )
            )
            at = end
        return out


def _read_varint_at(data: bytes, at: int) -> tuple[int, int]:
    return _read_varint(data, at), _varint_end(data, at)


def _read_bytes(data: bytes, at: int) -> tuple[bytes | None, int]:
    length, at = _read_varint_at(data, at)
    if length < 0:
        return None, at
    return bytes(data[at : at + length]), at + length


def read_batches(data: bytes) -> list[BatchView]:
    """The whole record batches (magic 2) at the start of ``data``, as a Fetch returns them
    (a batch cut off at the end is left out)."""
    out, at = [], 0
    while at + BATCH_HEADER.size <= len(data):
        (
            base_offset,
            length,
            _epoch,
            magic,
            _crc,
            attributes,
            last_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = BATCH_HEADER.unpack_from(data, at)
        end = at + LENGTH_START + length
        if end > len(data) or magic != MAGIC:
            break
        out.append(
            BatchView(
                base_offset,
                last_delta,
                producer_id,
                producer_epoch,
                base_sequence,
                attributes,
                base_timestamp,
                max_timestamp,
                count,
                bytes(data[at:end]),
            )
        )
        at = end
    return out


def decompress(codec: int, data: bytes) -> bytes:
    """A batch's records decompressed (aiokafka's codecs)."""
    from aiokafka import codec as codecs

    decode = {
        1: codecs.gzip_decode,
        2: codecs.snappy_decode,
        3: codecs.lz4_decode,
        4: codecs.zstd_decode,
    }[codec]
    return bytes(decode(data))
