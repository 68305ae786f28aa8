"""The on-disk layout of one metadata record, and scanning a segment's bytes (pure, no I/O).

Every record is framed as (big-endian)::

     0  u32  length of the bytes after the CRC field (format version .. end of payload)
     4  u32  CRC-32 (zlib) of those bytes
     8  u8   frame format version (1)
     9  u8   record type id (controller.records)
    10  u16  record payload version
    12  i64  offset (position in the log, from 0, one per record)
    20  i64  timestamp, milliseconds since the Unix epoch
    28  ...  payload: compact JSON of the record's fields

A segment file holds consecutive records, then possibly zero bytes and nothing else: the
space the writer preallocated for the records to come (``log_preallocate_bytes``), which a
reader stops at. A record never starts with zero bytes (its length is at least the
header's), so where the records end and the zeros begin is never in doubt. Its name is its
first offset.
"""

from __future__ import annotations

import datetime
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.records import (
    RECORD_VERSION,
    TYPE_IDS,
    ProducerIdsReserved,
    Record,
    RecordDecodeError,
    decode_payload,
    encode_payload,
    record_to_dict,
)

FRAME_FORMAT_VERSION: Final = 1
_PREFIX: Final = struct.Struct(">II")
_HEADER: Final = struct.Struct(">BBHqq")
HEADER_BYTES: Final = _PREFIX.size + _HEADER.size

#: No record pidctl writes comes near this; a larger length field can only be damage, and
#: refusing it bounds what a scan allocates.
MAX_RECORD_BYTES: Final = 1024 * 1024

#: The most one commit writes (the log's writer splits larger batches; one entry fits): the
#: reach of a write that a power cut left partly on disk (:func:`walk_segment`).
MAX_COMMIT_BYTES: Final = _PREFIX.size + MAX_RECORD_BYTES


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A record with its place in the log."""

    offset: int
    timestamp_ms: int
    record: Record


class RecordTooLarge(ValueError):
    """A record would exceed :data:`MAX_RECORD_BYTES`: replay could not read it back, so it
    is never appended (the request that made it is refused)."""


def encode_entry(offset: int, timestamp_ms: int, record: Record) -> bytes:
    """Frame one record for appending to a segment; :class:`RecordTooLarge` if replay could
    not read it back."""
    body = _HEADER.pack(
        FRAME_FORMAT_VERSION, TYPE_IDS[type(record)], RECORD_VERSION, offset, timestamp_ms
    ) + encode_payload(record)
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"{type(record).__name__} of {len(body)} bytes exceeds {MAX_RECORD_BYTES} bytes"
        )
    return _PREFIX.pack(len(body), zlib.crc32(body)) + body


#: Where an encoded entry's record type is.
_TYPE_BYTE: Final = _PREFIX.size + 1
#: A reservation's type id, looked for in every entry appended (:func:`reservation_of`).
_RESERVED: Final = TYPE_IDS[ProducerIdsReserved]


def reservation_of(entry: bytes) -> int | None:
    """The reservation an encoded entry makes (a :class:`ProducerIdsReserved`), or None:
    how the log knows what to write to its reservation file from the bytes it is given."""
    if entry[_TYPE_BYTE] != _RESERVED:
        return None
    record = decode_payload(_RESERVED, entry[HEADER_BYTES:])
    assert isinstance(record, ProducerIdsReserved)
    return record.next_producer_id


class _Invalid(Exception):
    pass


def _parse_at(data: bytes | memoryview, pos: int) -> tuple[LogEntry, int]:
    """Parse the record at ``pos``; return it and the position after it, or raise _Invalid."""
    if len(data) - pos < HEADER_BYTES:
        raise _Invalid("incomplete record header")
    length, crc = _PREFIX.unpack_from(data, pos)
    if length < _HEADER.size or length > MAX_RECORD_BYTES:
        raise _Invalid(f"implausible record length {length}")
    end = pos + _PREFIX.size + length
    if end > len(data):
        raise _Invalid("record extends past the end of the file")
    body = data[pos + _PREFIX.size : end]
    if zlib.crc32(body) != crc:
        raise _Invalid("checksum mismatch")
    version, record_type, _record_version, offset, timestamp_ms = _HEADER.unpack_from(body, 0)
    if version != FRAME_FORMAT_VERSION:
        raise _Invalid(f"unknown frame format version {version}")
    try:
        record = decode_payload(record_type, bytes(body[_HEADER.size :]))
    except RecordDecodeError as e:
        raise _Invalid(str(e)) from e
    return LogEntry(offset, timestamp_ms, record), end


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What a segment's bytes hold.

    ``entries`` are the valid records in order; ``valid_bytes`` is where they end. When the
    file continues past that with anything but zero bytes (``zero_bytes``: preallocated,
    not a problem), ``problem`` says why and ``torn`` whether it is a torn tail (nothing
    valid follows: a write cut short by a crash) rather than corruption.
    """

    entries: list[LogEntry]
    valid_bytes: int
    problem: str | None = None
    torn: bool = False
    zero_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """How a walk through a segment's bytes ended: as :class:`SegmentScan` without the
    entries (``records`` says how many were valid)."""

    records: int
    valid_bytes: int
    problem: str | None = None
    torn: bool = False
    zero_bytes: int = 0


def scan_segment(data: bytes, base_offset: int) -> SegmentScan:
    """Parse a segment's bytes, checking checksums and that offsets count up from the base."""
    entries: list[LogEntry] = []
    end = walk_segment(data, base_offset, entries.append)
    return SegmentScan(entries, end.valid_bytes, end.problem, end.torn, end.zero_bytes)


def walk_segment(
    data: bytes | memoryview, base_offset: int, visit: Callable[[LogEntry], object]
) -> SegmentEnd:
    """:func:`scan_segment` that keeps nothing: ``visit`` is called with each valid record in
    turn, as soon as it is parsed (recovery replays it at once, so a long log is never held
    decoded in memory). An exception from ``visit`` ends the walk."""
    view = memoryview(data)
    size = len(view)
    pos = 0
    expected = base_offset
    while pos < size:
        try:
            entry, end = _parse_at(view, pos)
        except _Invalid as e:
            if _all_zero(view[pos:]):
                return SegmentEnd(expected - base_offset, pos, zero_bytes=size - pos)
            torn = _only_the_last_write_after(view, pos, expected)
            return SegmentEnd(expected - base_offset, pos, f"at byte {pos}: {e}", torn)
        if entry.offset != expected:
            problem = f"at byte {pos}: offset {entry.offset} where {expected} was expected"
            return SegmentEnd(expected - base_offset, pos, problem, False)
        visit(entry)
        expected += 1
        pos = end
    return SegmentEnd(expected - base_offset, pos)


def read_entries(data: bytes | memoryview) -> Iterator[LogEntry]:
    """Every record framed in ``data``, which holds nothing else (a snapshot's body: its
    offsets are those its records stand at, not a count), one at a time as it is parsed;
    ValueError at the first that does not parse."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        try:
            entry, end = _parse_at(view, pos)
        except _Invalid as e:
            raise ValueError(f"at byte {pos}: {e}") from e
        yield entry
        pos = end


def _all_zero(view: memoryview) -> bool:
    """Whether every byte of ``view`` is zero (preallocated space), compared a chunk at a
    time against zeros rather than byte by byte."""
    chunk = len(_ZEROS)
    for start in range(0, len(view), chunk):
        part = view[start : start + chunk]
        if part != _ZEROS[: len(part)]:
            return False
    return True


_ZEROS: Final = bytes(64 * 1024)


def _only_the_last_write_after(view: memoryview, pos: int, expected: int) -> bool:
    """Whether what follows ``pos`` (where a record does not parse, and not only zeros) can
    be what one commit cut short left: a torn tail, rather than damage to synced records.

    A crash mid-write leaves part of the last commit's bytes: a prefix of them (a process
    killed mid-write), or, over preallocated zeros, any of its pages and not others (a power
    cut: the disk writes a commit's pages in no set order, and nothing but the sync that
    did not finish would have ordered them). So intact records may follow, but only that
    commit's: within :data:`MAX_COMMIT_BYTES` of ``pos``, with offsets past ``expected``,
    rising, and after a sector of zeros (one the cut left unwritten). An intact record
    anywhere else is corruption, and truncating would throw away acknowledged data."""
    data = bytes(view)  # (for find: a candidate starts where the version byte matches)
    last_start = len(data) - HEADER_BYTES
    reach = pos + MAX_COMMIT_BYTES
    previous = expected
    candidate = pos + 1
    while candidate <= last_start:
        version_at = data.find(_VERSION_BYTE, candidate + _PREFIX.size)
        if version_at < 0 or version_at - _PREFIX.size > last_start:
            return True
        candidate = version_at - _PREFIX.size
        try:
            entry, end = _parse_at(data, candidate)
        except _Invalid:
            candidate += 1
            continue
        if candidate >= reach or entry.offset <= previous:
            return False
        if previous == expected and not _zero_sector_within(data, pos, candidate):
            return False  # what lies before it is damage, not a sector never written
        previous, candidate = entry.offset, end
    return True


def _zero_sector_within(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` holds a whole aligned sector of zeros: what a power cut
    leaves of a commit's sector never written, over preallocated zeros. A flipped bit or a
    damaged record leaves no such thing."""
    first = -(-start // _SECTOR) * _SECTOR
    return any(
        data[at : at + _SECTOR] == _ZERO_SECTOR for at in range(first, end - _SECTOR + 1, _SECTOR)
    )


#: The unit a disk writes whole or not at all (the smallest there is).
_SECTOR: Final = 512
_ZERO_SECTOR: Final = bytes(_SECTOR)
_VERSION_BYTE: Final = bytes([FRAME_FORMAT_VERSION])


# -- names and views shared by the log, its tools and the Spark reader ------------------

SEGMENT_SUFFIX: Final = ".log"
SNAPSHOT_SUFFIX: Final = ".snapshot"
TMP_SUFFIX: Final = ".tmp"


class LogCorruption(PidctlError):
    """The log cannot be trusted; start-up stops and nothing is modified."""


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def offset_of(path: Path) -> int:
    """The offset a segment or snapshot file is named after."""
    try:
        return int(path.stem)
    except ValueError:
        raise LogCorruption(f"{path}: file name is not an offset") from None


def entry_to_dict(entry: LogEntry) -> dict[str, Any]:
    """One record as the JSON object ``pidctl log dump --json`` prints."""
    return {
        "offset": entry.offset,
        "timestamp_ms": entry.timestamp_ms,
        "time": iso_time(entry.timestamp_ms),
        **record_to_dict(entry.record),
    }


def iso_time(timestamp_ms: int) -> str:
    """A record's time as ISO 8601 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
