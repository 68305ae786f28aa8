"""The data dir's own files beside the records: its lock, the snapshot and reservation
file formats, and the storage calls, every failure of which is :class:`StorageFailed`
(fail-stop).

Layout of a data dir::

    .lock                         flock'd by the running server (one server per data dir)
    00000000000000000000.log      segment: consecutive records, named by its first offset
    00000000000000012345.snapshot state with every record below offset 12345 applied
    producer-ids.reserved         no producer id at or above this was granted

Snapshots and the reservation are written atomically (temporary file, fsync, rename,
directory fsync).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.logformat import (
    TMP_SUFFIX,
    LogCorruption,
    LogEntry,
    encode_entry,
    offset_of,
    read_entries,
    snapshot_name,
)
from pidctl.controller.core.records import SNAPSHOT_RECORDS, Record
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.legacy_snapshot import LEGACY_MAGICS, legacy_snapshot_entries

LOCK_FILE: Final = ".lock"


#: The reservation file: no PID at or above the value it holds was granted. Written
#: atomically before any grant that passes it (see :class:`ProducerIdsReserved`).
RESERVATION_FILE: Final = "producer-ids.reserved"


#: The next reservation is written into this file, opened ahead (so that a reservation needs
#: no new file descriptor when there is none to be had), then renamed over the reservation.
RESERVATION_NEXT_FILE: Final = RESERVATION_FILE + ".next"


#: A snapshot: this header (magic, CRC-32 and length of the rest), then records.
_SNAPSHOT_MAGIC: Final = b"PIDSNAP3"
_SNAPSHOT_HEADER: Final = struct.Struct(">8sIQ")


_RESERVATION_MAGIC: Final = b"PIDRSRV1"


#: magic, CRC-32 of the value's 8 bytes, the value (i64).
_RESERVATION: Final = struct.Struct(">8sIq")


class DataDirLocked(PidctlError):
    """Another process holds the data dir's lock."""


class StorageFailed(PidctlError):
    """A write or sync of the data dir failed. Fail-stop: nothing more is acknowledged and
    the process exits (a failed fsync is never retried: the kernel may have dropped the
    data and marked the pages clean, PostgreSQL's "fsyncgate", 2018)."""

    #: sysexits' EX_IOERR: the process stopped rather than answer anything it could not
    #: make durable.
    exit_code = 74
    line_prefix = "storage failed, stopping: "

    def __init__(self, path: Path, operation: str, error: OSError) -> None:
        self.path = path
        self.operation = operation
        self.errno = error.errno or 0
        self.errno_name = errno.errorcode.get(self.errno, str(self.errno))
        super().__init__(f"{operation} of {path} failed: {error.strerror or error}")


def out_of_descriptors(error: StorageFailed) -> bool:
    """Whether ``error`` is for want of a file descriptor now (EMFILE, ENFILE), not a
    failing disk: what opens a new file (a roll, a snapshot, a reservation's next file, the
    zeros ahead) is postponed, not fatal. (A function, not a property of the exception:
    compiled, reading that property in an ``except`` clause crashed the process.)"""
    return error.errno in (errno.EMFILE, errno.ENFILE)


def storage_call(path: Path, operation: str, call: Callable[..., Any], *args: Any) -> Any:
    """An OS call on the data dir; any failure is a :class:`StorageFailed`."""
    try:
        return call(*args)
    except OSError as e:
        raise StorageFailed(path, operation, e) from e


#: The records a snapshot restates, each with the offset it stands at
#: (``ControllerState.snapshot_records``).
SnapshotRecords = Iterable[tuple[int, Record]]


class _SnapshotBody:
    """A snapshot's records framed one by one as the log frames them
    (``logformat.encode_entry``), a record at a time (writing a snapshot of a million ids
    holds one record's bytes, not the file's), and the header they make: magic, then the
    CRC-32 and length of everything after it, known once every record is."""

    def __init__(self, records: SnapshotRecords, timestamp_ms: int) -> None:
        self._records = records
        self._timestamp_ms = timestamp_ms
        self._crc = 0
        self._length = 0

    def __iter__(self) -> Iterator[bytes]:
        for at, record in self._records:
            entry = encode_entry(at, self._timestamp_ms, record)
            self._crc = zlib.crc32(entry, self._crc)
            self._length += len(entry)
            yield entry

    def header(self) -> bytes:
        """The header, once every record was taken."""
        return _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, self._crc, self._length)


def encode_snapshot(records: SnapshotRecords, timestamp_ms: int = 0) -> bytes:
    """A snapshot file's bytes: its header, then its records."""
    body = _SnapshotBody(records, timestamp_ms)
    entries = b"".join(body)
    return body.header() + entries


def decode_snapshot(path: Path, data: bytes | memoryview) -> tuple[int, Iterator[LogEntry]]:
    """The offset a snapshot file stands at, and its records (each at the offset it stands
    at) as they are parsed, for replay to apply one at a time: :class:`LogCorruption` if the
    file is damaged in any way (its checksum, here; a record, when it is reached). A
    snapshot written before snapshots were records (``PIDSNAP1``, ``PIDSNAP2``) comes back
    as records too (``legacy_snapshot.py``, the one converter)."""
    view = memoryview(data)
    if len(view) < _SNAPSHOT_HEADER.size:
        raise LogCorruption(f"{path}: snapshot is truncated")
    magic, crc, length = _SNAPSHOT_HEADER.unpack_from(view, 0)
    body = view[_SNAPSHOT_HEADER.size :]
    if (
        (magic != _SNAPSHOT_MAGIC and magic not in LEGACY_MAGICS)
        or length != len(body)
        or zlib.crc32(body) != crc
    ):
        raise LogCorruption(f"{path}: snapshot checksum or length mismatch")
    offset = offset_of(path)
    if magic in LEGACY_MAGICS:
        return offset, iter(legacy_snapshot_entries(path, magic, body, offset))
    return offset, _checked_entries(path, body, offset)


def _checked_entries(path: Path, body: memoryview, offset: int) -> Iterator[LogEntry]:
    try:
        for entry in read_entries(body):
            # Each record stands where its state was written: at or before the snapshot's
            # offset, and a manager's state exactly there (the name is not another file's).
            at = entry.offset
            if at > offset or (type(entry.record) in SNAPSHOT_RECORDS and at != offset):
                raise ValueError(f"a record stands at offset {at}")
            yield entry
    except ValueError as e:
        raise LogCorruption(f"{path}: snapshot does not parse ({e})") from e


def encode_reservation(value: int) -> bytes:
    """The reservation file's 20 bytes: magic, CRC-32 of the value, the value."""
    packed = struct.pack(">q", value)
    return _RESERVATION.pack(_RESERVATION_MAGIC, zlib.crc32(packed), value)


def read_reservation(data_dir: Path) -> int | None:
    """The reservation file's value, None if there is none; :class:`LogCorruption` if it
    is damaged (it is only ever replaced whole, by a rename, so damage is never a torn
    write)."""
    path = data_dir / RESERVATION_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LogCorruption(f"{path}: cannot read the reservation ({e.strerror or e})") from e
    if len(data) != _RESERVATION.size:
        raise LogCorruption(f"{path}: reservation of {len(data)} bytes, not {_RESERVATION.size}")
    magic, crc, value = _RESERVATION.unpack(data)
    if magic != _RESERVATION_MAGIC or zlib.crc32(data[12:]) != crc or value < 0:
        raise LogCorruption(f"{path}: reservation damaged (magic or checksum mismatch)")
    return int(value)


def write_reservation_file(data_dir: Path, value: int) -> None:
    """Atomically replace the reservation: temporary file, fsync, rename, directory fsync."""
    path = data_dir / RESERVATION_FILE
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = storage_call(tmp, "open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(tmp, fd, encode_reservation(value))
        storage_call(tmp, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
    storage_call(path, "rename", os.replace, tmp, path)
    storage_call(data_dir, "fsync", fsync_dir, data_dir)


#: Written by start-up before it cuts a damaged tail off the log, removed once the
#: :class:`~pidctl.controller.core.records.DamagedTailTruncated` record that says so is
#: durable: a start-up cut short between the two still knows that the tail was cut.
DAMAGED_TAIL_FILE: Final = "damaged-tail.pending"


def write_damaged_tail_file(data_dir: Path, truncated_bytes: int) -> None:
    """Atomically note that ``truncated_bytes`` are being cut off the log's tail (more, if
    an earlier start-up's note is still there)."""
    truncated_bytes += max(0, read_damaged_tail_file(data_dir) or 0)
    path = data_dir / DAMAGED_TAIL_FILE
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = storage_call(tmp, "open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(tmp, fd, f"{truncated_bytes}\n".encode())
        storage_call(tmp, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
    storage_call(path, "rename", os.replace, tmp, path)
    storage_call(data_dir, "fsync", fsync_dir, data_dir)


def read_damaged_tail_file(data_dir: Path) -> int | None:
    """The bytes a start-up cut whose record is not yet durable; None: no such note; -1: a
    note that does not read (it still means a tail was cut)."""
    path = data_dir / DAMAGED_TAIL_FILE
    try:
        text = path.read_bytes().decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StorageFailed(path, "read", e) from e
    return int(text) if text.isdigit() else -1


def remove_damaged_tail_file(data_dir: Path) -> None:
    """The tail's record is durable: the note goes (and the directory is synced)."""
    remove_file(data_dir / DAMAGED_TAIL_FILE)
    storage_call(data_dir, "fsync", fsync_dir, data_dir)


def check_reservation(data_dir: Path, reservation: int | None, state: ControllerState) -> None:
    """The reservation file against the log: :class:`LogCorruption` if it is missing while
    the log reserved (its last reservation may be lost with it), or below what the log
    granted (the file is older than the log). Either needs an operator's word: ``pidctl
    log reserve``."""
    path = data_dir / RESERVATION_FILE
    logged = state.reservations.reserved
    fix = (
        f"restore the file, or if you know no producer id at or above N was handed out, "
        f"run `pidctl log reserve --data-dir {data_dir} --producer-id N`"
    )
    if reservation is None and logged:
        raise LogCorruption(
            f"{path}: missing, but the log reserved producer ids up to {logged} (a later "
            f"reservation may be lost with the file); {fix}"
        )
    if reservation is not None and reservation < state.next_producer_id:
        raise LogCorruption(
            f"{path}: reserves up to {reservation}, below the {state.next_producer_id} the "
            f"log granted (the file is older than the log); {fix}"
        )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_data_dir(data_dir: Path, *, by_operator: bool = False) -> int:
    """Take the data dir's exclusive lock, held until the process exits; return its fd.
    ``by_operator``: for a command that needs the controller stopped, which the refusal
    then says.

    The lock is a ``flock`` on the directory itself, so no file deletion releases it (the
    ``.lock`` file only says which process holds it, for people)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        if by_operator:
            raise DataDirLocked(f"{data_dir} is in use: stop the controller first") from None
        holder = lock_holder(data_dir) or "unknown"
        raise DataDirLocked(
            f"data dir {data_dir} is in use by another pidctl process (pid {holder})"
        ) from None
    with contextlib.suppress(OSError):  # information only: the lock is the directory's
        (data_dir / LOCK_FILE).write_text(f"{os.getpid()}\n")
    return fd


def lock_holder(data_dir: Path) -> str | None:
    """The pid holding the flock on ``data_dir`` (a running server), from the kernel's table
    of locks (so it is known even when the .lock file was deleted); None if no process
    holds it. Asking takes no lock: a server starting meanwhile is never refused."""
    try:
        st = os.stat(data_dir)
        device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234 0 EOF"
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
                return fields[4]
    except OSError:
        pass
    return None


def remove_file(path: Path) -> None:
    """Delete a file the log no longer needs; one already gone is no failure."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageFailed(path, "unlink", e) from e


def write_all(
    path: Path, fd: int, data: bytes | bytearray | memoryview, offset: int | None = None
) -> int:
    """Write all of ``data`` (at ``offset`` with ``pwrite``, if given: a segment's records
    go where the last one ended, before the zeros preallocated for them, where ``O_APPEND``
    would put them after); its length. A write that takes no byte (never, for a regular
    file) is a failure rather than a loop for ever."""
    view = memoryview(data)
    while view:
        if offset is None:
            written = storage_call(path, "write", os.write, fd, view)
        else:
            written = storage_call(path, "write", os.pwrite, fd, view, offset)
            offset += written
        if written == 0:
            raise took_no_byte(path, "write")
        view = view[written:]
    return len(data)


def took_no_byte(path: Path, operation: str) -> StorageFailed:
    """The failure (EIO) of a write that took no byte: never, for a regular file, so
    something is wrong, and looping on it would never end."""
    return StorageFailed(path, operation, OSError(errno.EIO, "write took no byte"))


#: How the log opens its segments: written at an offset (:func:`write_all`'s ``offset``).
SEGMENT_FLAGS: Final = os.O_WRONLY | os.O_CREAT


def create_segment(path: Path, dir_fd: int) -> int:
    """Create an empty segment atomically (a temporary file, synced, renamed, the directory
    synced through ``dir_fd``), so that a segment file either exists whole or not at all;
    return it open for writing. Only the first step needs a new file descriptor: an
    EMFILE can only come before anything changed."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    flags = SEGMENT_FLAGS | os.O_TRUNC
    fd: int = storage_call(tmp, "open", os.open, tmp, flags, 0o644)
    try:
        storage_call(tmp, "fsync", os.fsync, fd)
        storage_call(path, "rename", os.replace, tmp, path)
        storage_call(path.parent, "fsync", os.fsync, dir_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_snapshot_file(
    data_dir: Path, offset: int, records: SnapshotRecords, dir_fd: int | None = None
) -> Path:
    """Atomically write a snapshot: temporary file, fsync, rename, directory fsync (through
    ``dir_fd`` if given, so that only the temporary file needs a new file descriptor)."""
    path = data_dir / snapshot_name(offset)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = storage_call(tmp, "open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        # The records after room for the header, then the header (it holds their CRC).
        body = _SnapshotBody(records, int(time.time() * 1000))
        position = _SNAPSHOT_HEADER.size
        for entry in body:
            position += write_all(tmp, fd, entry, position)
        write_all(tmp, fd, body.header(), 0)
        storage_call(tmp, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
    storage_call(path, "rename", os.replace, tmp, path)
    if dir_fd is None:
        storage_call(data_dir, "fsync", fsync_dir, data_dir)
    else:
        storage_call(data_dir, "fsync", os.fsync, dir_fd)
    return path
