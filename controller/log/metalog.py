"""The metadata log on disk: segments, snapshots, recovery, and the group-commit writer.

Layout of a data dir::

    .lock                         flock'd by the running server (one server per data dir)
    00000000000000000000.log      segment: consecutive records, named by its first offset
    00000000000000012345.snapshot state with every record below offset 12345 applied

Writes go through one writer task: ``append`` only buffers (it never waits), the writer
writes everything buffered in one ``write`` and one ``fdatasync``, and only then are the
appended offsets durable. Requests that arrive while a sync runs share the next one (group
commit). A commit runs on the event loop itself while the disk answers quickly, and in the
log's own thread once it does not (see ``inline_sync_max_s``). Snapshots are written
atomically (temporary file, fsync, rename, directory fsync) and segments wholly below the
newest snapshot are then deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.logformat import (
    SEGMENT_SUFFIX as SEGMENT_SUFFIX,
)
from pidctl.controller.core.logformat import (
    SNAPSHOT_SUFFIX as SNAPSHOT_SUFFIX,
)
from pidctl.controller.core.logformat import (
    TMP_SUFFIX as TMP_SUFFIX,
)
from pidctl.controller.core.logformat import (
    LogCorruption as LogCorruption,
)
from pidctl.controller.core.logformat import (
    LogEntry,
    SegmentEnd,
    SegmentScan,
    reservation_of,
    walk_segment,
)
from pidctl.controller.core.logformat import (
    offset_of as offset_of,
)
from pidctl.controller.core.logformat import (
    segment_name as segment_name,
)
from pidctl.controller.core.logformat import (
    snapshot_name as snapshot_name,
)
from pidctl.controller.core.state import ControllerState, InvariantViolation
from pidctl.controller.log.disk_thread import DiskThread

log = structlog.get_logger("pidctl.metalog")

LOCK_FILE = ".lock"
#: The reservation file: no PID at or above the value it holds was granted. Written
#: atomically before any grant that passes it (see :class:`ProducerIdsReserved`).
RESERVATION_FILE = "producer-ids.reserved"
#: The next reservation is written into this file, opened ahead (so that a reservation needs
#: no new file descriptor when there is none to be had), then renamed over the reservation.
RESERVATION_NEXT_FILE = RESERVATION_FILE + ".next"

#: Default for ``segment_max_bytes``: roll to a new segment past this size. Snapshots roll
#: segments too, so this only matters if snapshots are disabled or rare.
DEFAULT_SEGMENT_MAX_BYTES = 64 * 1024 * 1024
#: Default for ``snapshot_interval_records``: a snapshot after this many records bounds the
#: replay at start-up (about 10 ms per 10,000 grant records here) whatever the history length.
DEFAULT_SNAPSHOT_INTERVAL_RECORDS = 10_000
#: Defaults for ``log_retention_bytes`` and ``log_retention_ms``: segments a snapshot covers
#: are kept as the audit trail (``pidctl log dump``) up to 100 MiB and 7 days, as Kafka keeps
#: its metadata log after snapshots (``metadata.max.retention.bytes`` and ``.ms``).
DEFAULT_RETENTION_BYTES = 100 * 1024 * 1024
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
#: Default for ``inline_sync_max_s``. A local disk syncs a commit in well under a millisecond
#: (p99 0.4 ms on the development machine); a network volume or a failing disk takes longer.
DEFAULT_INLINE_SYNC_MAX_S = 0.010
#: After a slow sync, commits stay in the log's thread until this many in a row there were
#: quick: a disk slow now and then (one sync in five, say) keeps them in the thread, rather
#: than holding the loop up for every other slow sync.
QUICK_SYNCS_BEFORE_THE_LOOP = 64
#: A slow sync on the loop within this many times the quick syncs needed (since commits came
#: back to the loop) doubles them: the disk is slow now and then, not once.
BACK_OFF_WINDOW = 8
#: The most quick syncs in a row the thread waits for (a disk slow once in this many
#: commits holds the loop up once in as many).
MAX_QUICK_SYNCS_BEFORE_THE_LOOP = 64 * 1024

_SNAPSHOT_MAGIC = b"PIDSNAP2"
#: Snapshots written before the binary sections (JSON only); still read.
_SNAPSHOT_MAGIC_V1 = b"PIDSNAP1"
_SNAPSHOT_HEADER = struct.Struct(">8sIQ")
_SNAPSHOT_JSON_LENGTH = struct.Struct(">I")
_RESERVATION_MAGIC = b"PIDRSRV1"
#: magic, CRC-32 of the value's 8 bytes, the value (i64).
_RESERVATION = struct.Struct(">8sIq")
#: Back-off while no file descriptor can be had for a reservation (commits wait meanwhile).
RESERVATION_RETRY_MIN_S = 0.05
RESERVATION_RETRY_MAX_S = 1.0


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


#: Errors that mean "no file descriptor now", not a failing disk: a roll or a snapshot
#: that meets one is postponed, not fatal.
_FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def _storage_call(path: Path, operation: str, call: Callable[..., Any], *args: Any) -> Any:
    """An OS call on the data dir; any failure is a :class:`StorageFailed`."""
    try:
        return call(*args)
    except OSError as e:
        raise StorageFailed(path, operation, e) from e


# -- snapshots --------------------------------------------------------------------------------

_BINARY = (bytes, bytearray, memoryview)


def encode_snapshot(offset: int, state: dict[str, Any]) -> bytes:
    """A snapshot file's bytes: the state's fields as JSON, except bytes-like ones (a
    million transactional ids, packed), which follow the JSON as raw sections, so neither
    writing nor loading one builds an object per value."""
    raw = [(name, value) for name, value in state.items() if isinstance(value, _BINARY)]
    fields = {name: value for name, value in state.items() if not isinstance(value, _BINARY)}
    head = json.dumps(
        {"offset": offset, "state": fields, "raw": [[name, len(value)] for name, value in raw]},
        separators=(",", ":"),
    ).encode()
    parts = [_SNAPSHOT_JSON_LENGTH.pack(len(head)), head, *(value for _, value in raw)]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    length = sum(len(part) for part in parts)
    return b"".join([_SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc, length), *parts])


def decode_snapshot(path: Path, data: bytes | memoryview) -> tuple[int, dict[str, Any]]:
    """Parse a snapshot file; raise :class:`LogCorruption` if it is damaged in any way.

    Raw sections come back as views of ``data`` (nothing is copied)."""
    view = memoryview(data)
    if len(view) < _SNAPSHOT_HEADER.size:
        raise LogCorruption(f"{path}: snapshot is truncated")
    magic, crc, length = _SNAPSHOT_HEADER.unpack_from(view, 0)
    body = view[_SNAPSHOT_HEADER.size :]
    if (
        magic not in (_SNAPSHOT_MAGIC, _SNAPSHOT_MAGIC_V1)
        or length != len(body)
        or zlib.crc32(body) != crc
    ):
        raise LogCorruption(f"{path}: snapshot checksum or length mismatch")
    try:
        if magic == _SNAPSHOT_MAGIC_V1:
            parsed = json.loads(bytes(body))
            raw = []
        else:
            (head_length,) = _SNAPSHOT_JSON_LENGTH.unpack_from(body, 0)
            head_end = _SNAPSHOT_JSON_LENGTH.size + head_length
            parsed = json.loads(bytes(body[_SNAPSHOT_JSON_LENGTH.size : head_end]))
            raw = parsed["raw"]
        offset = int(parsed["offset"])
        state = parsed["state"]
        if raw:
            position = head_end
            for name, size in raw:
                state[name] = body[position : position + size]
                position += size
            if position != len(body):
                raise ValueError(f"raw sections end at {position} of {len(body)} bytes")
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise LogCorruption(f"{path}: snapshot does not parse ({e})") from e
    if offset != offset_of(path):
        raise LogCorruption(f"{path}: snapshot says offset {offset}")
    return offset, state


# -- the reservation file ----------------------------------------------------------------------


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
    fd = _storage_call(tmp, "open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(tmp, fd, encode_reservation(value))
        _storage_call(tmp, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
    _storage_call(path, "rename", os.replace, tmp, path)
    _storage_call(data_dir, "fsync", _fsync_dir, data_dir)


def check_reservation(data_dir: Path, reservation: int | None, state: ControllerState) -> None:
    """The reservation file against the log: :class:`LogCorruption` if it is missing while
    the log reserved (its last reservation may be lost with it), or below what the log
    granted (the file is older than the log). Either needs an operator's word: ``pidctl
    log reserve``."""
    path = data_dir / RESERVATION_FILE
    logged = state.producer_ids.reserved
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


def reserve_by_operator(data_dir: Path, producer_id: int) -> str:
    """``pidctl log reserve`` (the controller stopped): replace a missing or damaged
    reservation file on an operator's word that no PID at or above ``producer_id`` was
    handed out (never below what the log itself granted). Returns what was done."""
    if not data_dir.is_dir():
        raise LogCorruption(f"{data_dir}: no such data dir")
    lock_fd = lock_data_dir(data_dir, by_operator=True)
    try:
        state = _replay_streaming(data_dir)[0]
        try:
            before = str(read_reservation(data_dir) or "none")
        except LogCorruption:
            before = "damaged"
        value = max(producer_id, state.next_producer_id)
        write_reservation_file(data_dir, value)
    finally:
        os.close(lock_fd)
    resume_at = state.producer_ids.resume(value).response
    return (
        f"{data_dir / RESERVATION_FILE}: reserved up to {value} (it was {before}; the log "
        f"granted up to {state.next_producer_id}); the next start grants from {resume_at}"
    )


# -- reading (read-only: used by recovery, dump and verify) ------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentRead:
    path: Path
    base_offset: int
    scan: SegmentScan


@dataclass(slots=True)
class LogContents:
    """Everything in a data dir, checked but not yet replayed or repaired."""

    snapshot_path: Path | None = None
    snapshot_offset: int = 0
    snapshot_state: dict[str, Any] | None = None
    segments: list[SegmentRead] = field(default_factory=list)
    #: Bytes at the end of the last segment that a crash left half-written.
    torn_tail_bytes: int = 0
    torn_tail_problem: str | None = None
    #: Empty segment files out of place (nothing in them to lose).
    stray_segments: list[Path] = field(default_factory=list)
    #: The reservation file's value (None: no file).
    reservation: int | None = None

    @property
    def end_offset(self) -> int:
        if self.segments:
            last = self.segments[-1]
            return last.base_offset + len(last.scan.entries)
        return self.snapshot_offset

    def entries(self, from_offset: int = 0) -> list[LogEntry]:
        return [e for s in self.segments for e in s.scan.entries if e.offset >= from_offset]


@dataclass(slots=True)
class _SegmentsWalked:
    """How a walk over a data dir's segments ended (see :func:`_walk_segments`)."""

    stray_segments: list[Path] = field(default_factory=list)
    first_base: int | None = None
    #: The offset after the last valid record (None: no segment).
    end_offset: int | None = None
    torn_segment: Path | None = None
    torn_valid_bytes: int = 0
    torn_tail_bytes: int = 0
    torn_tail_problem: str | None = None


def _covers_before(following: Path, offset: int) -> bool:
    """Whether the segment before ``following`` holds only records below ``offset``:
    ``following`` starts at or below it, and is no empty segment out of place (which says
    nothing about where the one before ends) unless it starts at ``offset`` exactly (the
    segment a snapshot rolled to, empty until the next record)."""
    base = offset_of(following)
    return base == offset or (base < offset and following.stat().st_size > 0)


def _walk_segments(
    data_dir: Path,
    visit: Callable[[LogEntry], object],
    segment_done: Callable[[Path, int, SegmentEnd], object] = lambda *_: None,
    progress: Callable[[int, int], None] | None = None,
    skip_below: int = 0,
) -> _SegmentsWalked:
    """Check every segment in order, mapped one at a time, calling ``visit`` with each valid
    record as it is read and ``segment_done`` after each segment: segments follow on from one
    another, an empty one out of place is set aside, and only the last non-empty segment may
    end in a torn tail. Raises :class:`LogCorruption` for anything else. The one walk behind
    :func:`read_log` (the tools keep every record) and :func:`recover` (replays each at once).

    Segments wholly below ``skip_below`` (the next one starts at or below it) are not read:
    :func:`recover` passes the snapshot's offset, since the snapshot holds their effect and
    they are only kept as the audit trail (``log_retention_bytes``, up to 100 MiB by
    default, whose reading would slow every start-up). ``pidctl log verify`` reads all."""
    walked = _SegmentsWalked()
    paths = sorted(data_dir.glob("*" + SEGMENT_SUFFIX), key=offset_of)
    while len(paths) > 1 and _covers_before(paths[1], skip_below):
        paths = paths[1:]
    total = sum(p.stat().st_size for p in paths)
    done = 0
    for index, path in enumerate(paths):
        base = offset_of(path)
        expected = walked.end_offset
        if expected is not None and base != expected and path.stat().st_size == 0:
            # An empty segment out of place holds nothing: left by a roll that failed before
            # rolls were atomic. Set aside (and removed by recovery).
            walked.stray_segments.append(path)
            continue
        if expected is not None and base != expected:
            raise LogCorruption(
                f"{path}: segment starts at offset {base}, expected {expected} "
                "(a segment is missing or out of place)"
            )
        with _mapped(path) as data:
            end = walk_segment(data, base, visit)
        if end.problem is not None:
            is_last = all(p.stat().st_size == 0 for p in paths[index + 1 :])
            if not (is_last and end.torn):
                raise LogCorruption(f"{path}: corrupt record {end.problem}")
            walked.torn_segment = path
            walked.torn_valid_bytes = end.valid_bytes
            walked.torn_tail_bytes = path.stat().st_size - end.valid_bytes
            walked.torn_tail_problem = end.problem
        segment_done(path, base, end)
        if walked.first_base is None:
            walked.first_base = base
        walked.end_offset = base + end.records
        done += path.stat().st_size
        if progress is not None:
            progress(done, total)
    return walked


def _check_log_start(data_dir: Path, snapshot: Path | None) -> None:
    """Without a snapshot the log must start at offset 0: a first segment further on means
    the records before it went with a snapshot that is gone (deleted, or not restored)."""
    if snapshot is not None:
        return
    segments = sorted(data_dir.glob("*" + SEGMENT_SUFFIX), key=offset_of)
    if segments and offset_of(segments[0]) > 0:
        first = offset_of(segments[0])
        raise LogCorruption(
            f"{data_dir}: the log starts at offset {first} ({segments[0].name}) and no "
            f"snapshot holds the records before it: the snapshot that covered offsets 0 to "
            f"{first - 1} was deleted or not restored; restore it (a *{SNAPSHOT_SUFFIX} file "
            f"at offset {first} or later) from a backup. Nothing was changed."
        )


def _check_snapshot_covered(path: Path, offset: int, walked: _SegmentsWalked) -> None:
    """A snapshot must lie within the log: a segment holds its offset, the log reaches it."""
    if walked.first_base is None or walked.end_offset is None:
        raise LogCorruption(f"{path}: no segment holds offset {offset} (no segment at all)")
    if walked.first_base > offset:
        raise LogCorruption(
            f"{path}: the newest snapshot is at offset {offset}, but the log starts at offset "
            f"{walked.first_base}: the records between are gone (a newer snapshot deleted or "
            "not restored?); restore the newer snapshot from a backup. Nothing was changed."
        )
    if walked.end_offset < offset:
        raise LogCorruption(
            f"log ends at offset {walked.end_offset}, before the snapshot at {offset}"
        )


#: ``pidctl log dump`` and ``verify`` may read a data dir a server is writing: between the
#: listing and the reading a roll, a snapshot or its cleaning may rename or delete a file, and
#: the newest segment may end in a record being written. Such a read starts again (after a
#: pause, at most this many times), so that what it reports is one consistent state of the
#: directory, never the server's work in progress.
LIVE_READ_ATTEMPTS = 20
LIVE_READ_PAUSE_S = 0.05


def read_log(data_dir: Path, progress: Callable[[int, int], None] | None = None) -> LogContents:
    """Read and check every file in ``data_dir`` without changing anything.

    ``progress(bytes_read, bytes_total)`` is called after each segment.

    Raises :class:`LogCorruption` for damage anywhere but a torn tail of the last segment,
    which is reported in ``torn_tail_bytes`` instead. Safe while a server writes the data
    dir: a read that met its changes (a file gone, a log that no longer starts where the
    snapshot read says, a record half-written at the end) is read again, up to
    ``LIVE_READ_ATTEMPTS`` times, while a server holds the data dir's lock."""
    attempt = 1
    while True:
        try:
            contents = _read_log_once(data_dir, progress)
        except (FileNotFoundError, LogCorruption):
            if attempt >= LIVE_READ_ATTEMPTS or lock_holder(data_dir) is None:
                raise
        else:
            if not contents.torn_tail_bytes or attempt >= LIVE_READ_ATTEMPTS:
                return contents
            if lock_holder(data_dir) is None:
                return contents
        attempt += 1
        time.sleep(LIVE_READ_PAUSE_S)


def _read_log_once(data_dir: Path, progress: Callable[[int, int], None] | None) -> LogContents:
    contents = LogContents()
    if not data_dir.is_dir():
        return contents
    snapshots = sorted(data_dir.glob("*" + SNAPSHOT_SUFFIX), key=offset_of)
    if snapshots:
        latest = snapshots[-1]
        offset, state = decode_snapshot(latest, latest.read_bytes())
        contents.snapshot_path = latest
        contents.snapshot_offset = offset
        contents.snapshot_state = state
    _check_log_start(data_dir, contents.snapshot_path)
    entries: list[LogEntry] = []

    def segment_done(path: Path, base: int, end: SegmentEnd) -> None:
        scan = SegmentScan(entries.copy(), end.valid_bytes, end.problem, end.torn)
        contents.segments.append(SegmentRead(path, base, scan))
        entries.clear()

    walked = _walk_segments(data_dir, entries.append, segment_done, progress)
    contents.stray_segments = walked.stray_segments
    contents.torn_tail_bytes = walked.torn_tail_bytes
    contents.torn_tail_problem = walked.torn_tail_problem
    if contents.snapshot_path is not None:
        _check_snapshot_covered(contents.snapshot_path, contents.snapshot_offset, walked)
    # After the segments: a server running meanwhile only raises it above their grants.
    contents.reservation = read_reservation(data_dir)
    return contents


def rebuild_state(contents: LogContents) -> tuple[ControllerState, int]:
    """Replay the log onto its latest snapshot; return the state and how many records
    were replayed. Raises :class:`LogCorruption` if a record breaks an invariant."""
    if contents.snapshot_state is not None:
        try:
            state = ControllerState.from_snapshot(contents.snapshot_state)
        except (KeyError, TypeError, ValueError) as e:
            raise LogCorruption(f"{contents.snapshot_path}: bad snapshot state ({e})") from e
    else:
        state = ControllerState()
    replayed = 0
    for entry in contents.entries(from_offset=contents.snapshot_offset):
        try:
            state.replay(entry.offset, entry.record)
        except InvariantViolation as e:
            raise LogCorruption(f"invariant broken: {e}") from e
        replayed += 1
    return state, replayed


# -- the writer ----------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
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


@dataclass(slots=True)
class Recovery:
    state: ControllerState
    records_replayed: int
    snapshot_offset: int
    truncated_bytes: int
    #: The reservation file's value (None: no file; the log never reserved).
    reservation: int | None = None


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """A file's bytes mapped read-only: they stay in the page cache and leave this process
    when unmapped, rather than being copied onto the heap (where a big buffer is freed but
    not always given back)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield memoryview(b"")
            return
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapping)
    try:
        yield view
    finally:
        # A view still referenced (by an error's traceback) keeps the mapping open until it
        # is collected; the error itself is what matters then.
        with contextlib.suppress(BufferError):
            view.release()
            mapping.close()


def _restore_snapshot(path: Path) -> tuple[int, ControllerState]:
    """The state in a snapshot file, built from the mapped file (its packed transactional
    ids go straight into the table: no intermediate object per id)."""
    with _mapped(path) as data:
        offset, fields = decode_snapshot(path, data)
        try:
            state = ControllerState.from_snapshot(fields)
        except (KeyError, TypeError, ValueError) as e:
            raise LogCorruption(f"{path}: bad snapshot state ({e})") from e
        finally:
            del fields
    return offset, state


def _replay_streaming(data_dir: Path) -> tuple[ControllerState, int, int, _SegmentsWalked]:
    """:func:`read_log` and :func:`rebuild_state` in one pass, holding no record longer
    than it takes to apply it: the snapshot is restored, then :func:`_walk_segments` checks
    every record and each one the snapshot does not cover is replayed at once. Returns the
    state, the records replayed, the snapshot's offset and how the walk ended."""
    snapshots = sorted(data_dir.glob("*" + SNAPSHOT_SUFFIX), key=offset_of)
    snapshot_path = snapshots[-1] if snapshots else None
    if snapshot_path is not None:
        snapshot_offset, state = _restore_snapshot(snapshot_path)
    else:
        snapshot_offset, state = 0, ControllerState()
    _check_log_start(data_dir, snapshot_path)
    replayed = 0

    def replay(entry: LogEntry) -> None:
        nonlocal replayed
        if entry.offset >= snapshot_offset:
            try:
                state.replay(entry.offset, entry.record)
            except InvariantViolation as e:
                raise LogCorruption(f"invariant broken: {e}") from e
            replayed += 1

    walked = _walk_segments(data_dir, replay, skip_below=snapshot_offset)
    if snapshot_path is not None:
        _check_snapshot_covered(snapshot_path, snapshot_offset, walked)
    return state, replayed, snapshot_offset, walked


def recover(data_dir: Path) -> Recovery:
    """Start-up: read and check everything, rebuild the state, then (only if all is well)
    truncate a torn tail and remove leftovers of an interrupted snapshot.

    Records are replayed as they are read (see :func:`_replay_streaming`), so what recovery
    leaves in memory is the state, not the history it was built from."""
    state, replayed, snapshot_offset, walked = _replay_streaming(data_dir)
    reservation = read_reservation(data_dir)
    check_reservation(data_dir, reservation, state)
    for leftover in data_dir.glob("*" + TMP_SUFFIX):
        log.warning("removing what an interrupted roll or snapshot left", file=str(leftover))
        _storage_call(leftover, "unlink", leftover.unlink)
    for stray in walked.stray_segments:
        log.warning("removing an empty segment out of place", segment=str(stray))
        _storage_call(stray, "unlink", stray.unlink)
    if walked.torn_segment is not None and walked.torn_tail_bytes:
        log.warning(
            "truncating torn tail",
            segment=str(walked.torn_segment),
            bytes=walked.torn_tail_bytes,
            problem=walked.torn_tail_problem,
            note="a write cut short by a crash, or damage to a synced record: grants go on "
            "above the reservation",
        )
        _truncate(walked.torn_segment, walked.torn_valid_bytes)
    return Recovery(state, replayed, snapshot_offset, walked.torn_tail_bytes, reservation)


def _truncate(path: Path, size: int) -> None:
    """Cut a segment to ``size`` bytes and sync it; a failure names the file and step."""
    fd = _storage_call(path, "open", os.open, path, os.O_WRONLY)
    try:
        _storage_call(path, "ftruncate", os.ftruncate, fd, size)
        _storage_call(path, "fsync", os.fsync, fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class SyncPlace:
    """Where the next commit's ``write`` and ``fdatasync`` run: on the event loop while they
    take less than ``max_s``; after a slower one in the log's thread, until ``quick_needed``
    in a row there were quick (``QUICK_SYNCS_BEFORE_THE_LOOP`` at first). ``max_s`` 0:
    always in the thread.

    A slow sync on the loop soon after coming back (within ``BACK_OFF_WINDOW`` times
    ``quick_needed`` quick syncs there) doubles ``quick_needed``, up to
    ``MAX_QUICK_SYNCS_BEFORE_THE_LOOP``: a disk slow about every 65th sync would otherwise
    hold the loop up once per 130 commits for ever; now it holds it up twice, then commits
    stay in the thread. A whole window of quick syncs on the loop halves it again."""

    max_s: float
    in_thread: bool = field(init=False)
    quick_in_thread: int = field(default=0, init=False)
    quick_needed: int = field(default=QUICK_SYNCS_BEFORE_THE_LOOP, init=False)
    #: Quick syncs on the loop since commits came back to it from the thread, while that
    #: is recent (None: not recently).
    quick_since_back: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.in_thread = self.max_s <= 0

    def after(self, took: float) -> None:
        """The commit just made (where ``in_thread`` said) took ``took`` seconds."""
        slow = self.max_s <= 0 or took >= self.max_s
        if not self.in_thread:
            self._after_on_loop(slow)
            return
        self.quick_in_thread = 0 if slow else self.quick_in_thread + 1
        if self.quick_in_thread >= self.quick_needed:
            self.in_thread, self.quick_since_back = False, 0

    def _after_on_loop(self, slow: bool) -> None:
        back = self.quick_since_back
        if slow:
            if back is not None:  # slow again soon after coming back: back off further
                self.quick_needed = min(2 * self.quick_needed, MAX_QUICK_SYNCS_BEFORE_THE_LOOP)
            self.in_thread, self.quick_in_thread, self.quick_since_back = True, 0, None
        elif back is not None:
            back += 1
            if back >= BACK_OFF_WINDOW * self.quick_needed:
                self.quick_needed = max(QUICK_SYNCS_BEFORE_THE_LOOP, self.quick_needed // 2)
                back = None
            self.quick_since_back = back


class MetadataLog:
    """Append records, wait for them to be durable; one writer task does all disk I/O.

    Fail-stop: after a failed write or sync (of a segment, a roll or a snapshot) nothing is
    marked durable any more, ``on_failure`` is told once, and :meth:`run` raises
    :class:`StorageFailed`; waiters are never woken, so nothing more is answered.
    ``on_durable`` is told the new durable end after each commit.

    Where a commit's ``write`` and ``fdatasync`` run (:class:`SyncPlace`): on the event
    loop while syncs take less than ``inline_sync_max_s``, and after a slower one in the
    log's thread until ``QUICK_SYNCS_BEFORE_THE_LOOP`` in a row there were quick (0: always
    in the thread). Handing a commit to a thread and
    back costs more than a quick sync: the thread must be woken on another core and win the
    GIL from a busy loop, and the loop woken in turn (about 1.5 ms per commit under load,
    where the disk takes 0.2-0.4 ms, and more of the loop's time per request than the sync
    itself). On a slow disk the thread keeps the loop serving everything that does not wait
    for the disk (ApiVersions, Metadata, InitProducerId from a durable block, /healthz) and
    the loop is held up by one slow sync at a time, and rarely. ``on_batch(records, seconds,
    in_thread)`` is told of each commit."""

    def __init__(
        self,
        data_dir: Path,
        end_offset: int,
        snapshot_offset: int,
        snapshot_source: Callable[[], Callable[[], dict[str, Any]]],
        *,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        snapshot_interval_records: int = DEFAULT_SNAPSHOT_INTERVAL_RECORDS,
        retention_bytes: int = DEFAULT_RETENTION_BYTES,
        retention_ms: int = DEFAULT_RETENTION_MS,
        inline_sync_max_s: float = DEFAULT_INLINE_SYNC_MAX_S,
        on_batch: Callable[[int, float, bool], None] | None = None,
        on_snapshot: Callable[[int], None] | None = None,
        on_failure: Callable[[StorageFailed], None] | None = None,
        on_durable: Callable[[int], None] | None = None,
        reservation: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.end_offset = end_offset
        self.durable_end = end_offset  # every offset below this is on disk
        self.snapshot_offset = snapshot_offset
        self.segment_max_bytes = segment_max_bytes
        self.snapshot_interval_records = snapshot_interval_records
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self._sync_place = SyncPlace(inline_sync_max_s)
        self.failed: StorageFailed | None = None
        self._snapshot_source = snapshot_source
        self._on_batch = on_batch
        self._on_snapshot = on_snapshot
        self._on_failure = on_failure
        self._on_durable = on_durable
        self._pending: list[bytes] = []
        self._pending_event = trio.Event()
        self._durable_event = trio.Event()
        self._closed = False
        self._snapshot_running = False
        #: The reservation file's value on disk, and the one the records appended ask for
        #: (see :meth:`append_entry`).
        self.reserved = reservation
        self._reservation_wanted = reservation
        # Held for the log's life: directory syncs never need a new descriptor.
        self._dir_fd: int = _storage_call(
            data_dir, "open", os.open, data_dir, os.O_RDONLY | os.O_DIRECTORY
        )
        self._spare_fd: int | None = None
        self._open_spare()
        # The segments and snapshots in the data dir, by offset, oldest first: listed once
        # here, then kept by the log (the only writer: the data dir is locked), so that
        # cleaning up after a snapshot needs no file descriptor to list the directory.
        self._segments = sorted(offset_of(p) for p in data_dir.glob("*" + SEGMENT_SUFFIX))
        self._snapshots = sorted(offset_of(p) for p in data_dir.glob("*" + SNAPSHOT_SUFFIX))
        self._path, self._fd = self._open_active_segment()
        # Kept here rather than asked of the file after every commit (the log is the only
        # writer of its active segment: the data dir is locked).
        self._size: int = _storage_call(self._path, "fstat", os.fstat, self._fd).st_size
        self._disk: DiskThread | None = None

    def _open_active_segment(self) -> tuple[Path, int]:
        if self._segments:
            path = self.data_dir / segment_name(self._segments[-1])
            return path, _storage_call(path, "open", os.open, path, _APPEND_FLAGS, 0o644)
        path = self.data_dir / segment_name(self.end_offset)
        fd = _create_segment(path, self._dir_fd)
        self._segments.append(self.end_offset)
        return path, fd

    def append_entry(self, entry: bytes) -> int:
        """Buffer an entry encoded for the next offset (:func:`encode_entry`).

        A reservation (:class:`ProducerIdsReserved`) also goes to the reservation file:
        before the commit that holds it when it raises the reservation (so no grant past the
        file is ever written), after that commit when it lowers it (a clean shutdown)."""
        if self._closed or self.failed is not None:
            raise RuntimeError("metadata log is closed")
        reservation = reservation_of(entry)
        if reservation is not None:
            self._reservation_wanted = reservation
        offset = self.end_offset
        self._pending.append(entry)
        self.end_offset = offset + 1
        self._pending_event.set()
        return offset

    async def wait_durable(self, offset: int) -> None:
        """Return once the record at ``offset`` (and every one before it) is on disk; after
        a storage failure, never (the process is going down)."""
        while self.durable_end <= offset:
            await self._durable_event.wait()

    async def flush(self) -> None:
        """Wait until everything appended so far is durable."""
        await self.wait_durable(self.end_offset - 1)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: commit batches until cancelled, then commit what is left.

        Snapshots are written by a task of their own, so commits go on meanwhile."""
        self._disk = DiskThread("pidctl-log-commit")
        task_status.started()
        try:
            async with trio.open_nursery() as snapshots:
                try:
                    while True:
                        await self._pending_event.wait()
                        await self._commit_batch(snapshots)
                finally:
                    with trio.CancelScope(shield=True):
                        while self._pending and self.failed is None:
                            await self._commit_batch(None)
        finally:
            self._closed = True
            self._disk.close()
            for fd in (self._fd, self._dir_fd, self._spare_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _fail(self, error: StorageFailed) -> None:
        if self.failed is None:
            self.failed = error
            if self._on_failure is not None:
                self._on_failure(error)

    async def _commit_batch(self, snapshots: trio.Nursery | None) -> None:
        await self._raise_reservation()
        batch, self._pending = self._pending, []
        self._pending_event = trio.Event()
        batch_end = self.end_offset
        snapshot = None
        due = batch_end - self.snapshot_offset >= self.snapshot_interval_records
        if due and snapshots is not None and not self._snapshot_running:
            # Captured now, while state and log agree on batch_end (no await since the last
            # append); the source returns a cheap copy, turned into the snapshot in a thread.
            snapshot = self._snapshot_source()
        data = b"".join(batch)
        in_thread = self._sync_place.in_thread
        started = trio.current_time()
        disk = self._disk
        assert disk is not None
        # Not cancellable: a sync in progress must finish before anyone is told the outcome.
        try:
            if in_thread:
                size = await disk.call(self._write_and_sync, data)
            else:
                size = self._write_and_sync(data)
            took = trio.current_time() - started
            self._sync_place.after(took)
            self._after_batch(len(batch), took, in_thread, batch_end)
            lowered = self._reservation_wanted
            if lowered is not None and self.reserved is not None and lowered < self.reserved:
                await self._reserve(lowered, in_thread=True)
            if snapshot is not None and snapshots is not None:
                # Roll first, so that a snapshot at batch_end always has a segment there.
                # (Rolls are rare: a worker thread of trio's, as the snapshots.)
                if await trio.to_thread.run_sync(self._roll, batch_end):
                    self._snapshot_running = True
                    snapshots.start_soon(self._write_snapshot, batch_end, snapshot)
            elif size >= self.segment_max_bytes:
                await trio.to_thread.run_sync(self._roll, batch_end)
        except StorageFailed as e:
            self._fail(e)  # at once: /readyz fails before anything else happens
            raise

    async def _raise_reservation(self) -> None:
        """Make the reservation the pending records ask for durable before they are written.
        With no file descriptor for it (EMFILE, and none opened ahead), the commit waits and
        tries again."""
        delay = RESERVATION_RETRY_MIN_S
        while True:
            wanted = self._reservation_wanted
            if wanted is None or (self.reserved is not None and wanted <= self.reserved):
                return
            if await self._reserve(wanted, self._sync_place.in_thread):
                return
            log.warning("reservation postponed; commits wait", retry_in_s=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RESERVATION_RETRY_MAX_S)

    async def _reserve(self, value: int, in_thread: bool) -> bool:
        """Write ``value`` to the reservation file (see :meth:`_write_reservation`); False
        if postponed."""
        disk = self._disk
        assert disk is not None
        try:
            if in_thread:
                done = await disk.call(self._write_reservation, value)
            else:
                done = self._write_reservation(value)
        except StorageFailed as e:
            self._fail(e)
            raise
        if done:
            self.reserved = value
        return done

    def _write_reservation(self, value: int) -> bool:
        """Replace the reservation file atomically through the descriptor opened ahead
        (written, fsynced, renamed over it, the directory fsynced), then open the next one
        ahead. False if there is no descriptor to be had (EMFILE): nothing was changed."""
        if self._spare_fd is None and not self._open_spare():
            return False
        fd, self._spare_fd = self._spare_fd, None
        assert fd is not None
        spare = self.data_dir / RESERVATION_NEXT_FILE
        try:
            data = encode_reservation(value)
            written = _storage_call(spare, "write", os.pwrite, fd, data, 0)
            if written != len(data):
                raise StorageFailed(spare, "write", OSError(errno.EIO, "short write"))
            _storage_call(spare, "fsync", os.fsync, fd)
        finally:
            os.close(fd)
        path = self.data_dir / RESERVATION_FILE
        _storage_call(path, "rename", os.replace, spare, path)
        _storage_call(self.data_dir, "fsync", os.fsync, self._dir_fd)
        self._open_spare()
        return True

    def _open_spare(self) -> bool:
        """Open (empty) the file the next reservation is written into; False on EMFILE."""
        spare = self.data_dir / RESERVATION_NEXT_FILE
        try:
            self._spare_fd = _storage_call(
                spare, "open", os.open, spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("no file descriptor for the next reservation yet", error=e.errno_name)
            return False
        return True

    def _after_batch(self, records: int, took: float, in_thread: bool, batch_end: int) -> None:
        if self._on_batch is not None:
            self._on_batch(records, took, in_thread)
        self.durable_end = batch_end
        done, self._durable_event = self._durable_event, trio.Event()
        done.set()
        if self._on_durable is not None:
            self._on_durable(batch_end)

    async def _write_snapshot(self, offset: int, state: Callable[[], dict[str, Any]]) -> None:
        # Shielded: a snapshot that has started is finished even during shutdown.
        with trio.CancelScope(shield=True):
            try:
                size = await trio.to_thread.run_sync(self._snapshot_and_clean, offset, state)
                if size is not None:
                    self.snapshot_offset = offset
                    if self._on_snapshot is not None:
                        self._on_snapshot(size)
            except StorageFailed as e:
                self._fail(e)
                raise
            finally:
                self._snapshot_running = False

    def _write_and_sync(self, data: bytes) -> int:
        """Append ``data`` and make it durable; the segment's size after it."""
        self._size += _write_all(self._path, self._fd, data)
        _storage_call(self._path, "fdatasync", os.fdatasync, self._fd)
        return self._size

    def _roll(self, base_offset: int) -> bool:
        """Start a new segment at ``base_offset``; False if postponed (no file descriptor
        to be had: tried again after the next batch)."""
        path = self.data_dir / segment_name(base_offset)
        if path == self._path:
            return True  # nothing was written since this segment began
        if path.exists():
            raise LogCorruption(f"{path}: a segment already starts at offset {base_offset}")
        try:
            fd = _create_segment(path, self._dir_fd)
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("segment roll postponed", segment=str(path), error=e.errno_name)
            return False
        old, self._fd, self._path, self._size = self._fd, fd, path, 0
        self._segments.append(base_offset)
        os.close(old)
        return True

    def _snapshot_and_clean(self, offset: int, state: Callable[[], dict[str, Any]]) -> int | None:
        """Write the snapshot at ``offset``, then delete what it covers; None if postponed.

        Only the snapshot's temporary file needs a new file descriptor (the directory is
        synced through the log's own), and it is the first step: without one (EMFILE) the
        snapshot is postponed with nothing changed, and taken again after the next batch."""
        try:
            path = write_snapshot_file(self.data_dir, offset, state(), self._dir_fd)
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("snapshot postponed", offset=offset, error=e.errno_name)
            return None
        size: int = _storage_call(path, "stat", os.stat, path).st_size
        older, self._snapshots = [o for o in self._snapshots if o < offset], [offset]
        for old in older:
            _remove(self.data_dir / snapshot_name(old))
        self._delete_covered_segments(offset)
        _storage_call(self.data_dir, "fsync", os.fsync, self._dir_fd)
        log.info("snapshot written", offset=offset, bytes=size)
        return size

    def _delete_covered_segments(self, offset: int) -> None:
        """Segments wholly below the snapshot are not needed for recovery; the newest of
        them are kept as the audit trail for `pidctl log dump`, up to ``retention_bytes`` in
        all and for ``retention_ms`` after their last write. The rest go, oldest first, so a
        crash midway never leaves a gap between segments."""
        covered = [base for base in self._segments if base < offset]
        kept, now = 0, time.time()
        for index in range(len(covered) - 1, -1, -1):
            segment = self.data_dir / segment_name(covered[index])
            try:
                st = os.stat(segment)
            except FileNotFoundError:  # removed by hand: nothing to keep or delete
                self._segments.remove(covered[index])
                continue
            except OSError as e:
                raise StorageFailed(segment, "stat", e) from e
            kept += st.st_size
            if kept > self.retention_bytes or (now - st.st_mtime) * 1000 >= self.retention_ms:
                for old in covered[: index + 1]:
                    _remove(self.data_dir / segment_name(old))
                    self._segments.remove(old)
                break


def _remove(path: Path) -> None:
    """Delete a file the log no longer needs; one already gone is no failure."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageFailed(path, "unlink", e) from e


def _write_all(path: Path, fd: int, data: bytes) -> int:
    """Write all of ``data``; its length. A write that takes no byte (never, for a regular
    file) is a failure rather than a loop for ever."""
    view = memoryview(data)
    while view:
        written = _storage_call(path, "write", os.write, fd, view)
        if written == 0:
            error = OSError(errno.EIO, "write took no byte")
            raise StorageFailed(path, "write", error)
        view = view[written:]
    return len(data)


_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def _create_segment(path: Path, dir_fd: int) -> int:
    """Create an empty segment atomically (a temporary file, synced, renamed, the directory
    synced through ``dir_fd``), so that a segment file either exists whole or not at all;
    return it open for appending. Only the first step needs a new file descriptor: an
    EMFILE can only come before anything changed."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    flags = _APPEND_FLAGS | os.O_TRUNC
    fd: int = _storage_call(tmp, "open", os.open, tmp, flags, 0o644)
    try:
        _storage_call(tmp, "fsync", os.fsync, fd)
        _storage_call(path, "rename", os.replace, tmp, path)
        _storage_call(path.parent, "fsync", os.fsync, dir_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_snapshot_file(
    data_dir: Path, offset: int, state: dict[str, Any], dir_fd: int | None = None
) -> Path:
    """Atomically write a snapshot: temporary file, fsync, rename, directory fsync (through
    ``dir_fd`` if given, so that only the temporary file needs a new file descriptor)."""
    path = data_dir / snapshot_name(offset)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    data = encode_snapshot(offset, state)
    fd = _storage_call(tmp, "open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(tmp, fd, data)
        _storage_call(tmp, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
    _storage_call(path, "rename", os.replace, tmp, path)
    if dir_fd is None:
        _storage_call(data_dir, "fsync", _fsync_dir, data_dir)
    else:
        _storage_call(data_dir, "fsync", os.fsync, dir_fd)
    return path
