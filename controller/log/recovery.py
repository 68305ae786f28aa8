"""Reading a data dir back: every record checked (read-only, for ``pidctl log dump`` and
``verify``), and start-up's recovery, which replays the latest snapshot and the segments
after it through the same ``state.replay`` — the state that wrote the log is the state that
comes back — and only then truncates a torn tail.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.logformat import (
    SEGMENT_SUFFIX,
    SNAPSHOT_SUFFIX,
    TMP_SUFFIX,
    LogCorruption,
    LogEntry,
    SegmentEnd,
    SegmentScan,
    offset_of,
    walk_segment,
)
from pidctl.controller.core.state import ControllerState, InvariantViolation
from pidctl.controller.log.datadir import (
    RESERVATION_FILE,
    check_reservation,
    decode_snapshot,
    lock_data_dir,
    lock_holder,
    read_damaged_tail_file,
    read_reservation,
    storage_call,
    write_damaged_tail_file,
    write_reservation_file,
)

log: Final = structlog.get_logger("pidctl.metalog")


class ReservationRefused(PidctlError):
    """``pidctl log reserve`` refuses a value: past the range, or below an intact
    reservation without ``--force``."""

    exit_code = 2


def highest_reservation(last_producer_id: int = INT64_MAX - 1) -> int:
    """The highest value ``pidctl log reserve`` takes for a range ending at
    ``last_producer_id``: the start of the range's last whole block. Above it, a start-up
    would find no block to grant, and answer every request with an error."""
    return last_producer_id - BLOCK_SIZE + 1


def reserve_by_operator(
    data_dir: Path,
    producer_id: int,
    *,
    last_producer_id: int = INT64_MAX - 1,
    force: bool = False,
) -> str:
    """``pidctl log reserve`` (the controller stopped): replace a missing or damaged
    reservation file on an operator's word that no PID at or above ``producer_id`` was
    handed out (never below what the log itself granted). Refused
    (:class:`ReservationRefused`) past the range's last block, and below an intact
    reservation unless ``force``: the reservation is what a start-up skips to, above
    grants the log's tail may have lost. Returns what was done."""
    most = highest_reservation(last_producer_id)
    if not 0 <= producer_id <= most:
        raise ReservationRefused(
            f"--producer-id {producer_id} is past the last block of the range (at most "
            f"{most}, with last_producer_id {last_producer_id}): a start-up would find no "
            "block to grant"
        )
    if not data_dir.is_dir():
        raise LogCorruption(f"{data_dir}: no such data dir")
    lock_fd = lock_data_dir(data_dir, by_operator=True)
    try:
        state = _replay_streaming(data_dir)[0]
        try:
            intact = read_reservation(data_dir)
            before = str(intact or "none")
        except LogCorruption:
            intact, before = None, "damaged"
        value = max(producer_id, state.next_producer_id)
        if intact is not None and value < intact and not force:
            raise ReservationRefused(
                f"{data_dir / RESERVATION_FILE} holds an intact reservation up to {intact}, "
                f"above {value}: lowering it could let a start-up grant producer ids the "
                "log's lost tail had granted; --force to lower it all the same"
            )
        write_reservation_file(data_dir, value)
    finally:
        os.close(lock_fd)
    resume_at = state.producer_ids.resume(value).response
    return (
        f"{data_dir / RESERVATION_FILE}: reserved up to {value} (it was {before}; the log "
        f"granted up to {state.next_producer_id}); the next start grants from {resume_at}"
    )


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
    #: The snapshot's records (None: no snapshot), each at the offset it stands at.
    snapshot_entries: list[LogEntry] | None = None
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
    #: Segments ending in preallocated zero bytes, and where their records end.
    zero_tails: list[tuple[Path, int]] = field(default_factory=list)


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
    read_segment: Callable[[Path], contextlib.AbstractContextManager[memoryview]] | None = None,
) -> _SegmentsWalked:
    """Check every segment in order, mapped one at a time, calling ``visit`` with each valid
    record as it is read and ``segment_done`` after each segment: segments follow on from one
    another, an empty one out of place is set aside, and only the last non-empty segment may
    end in a torn tail. Raises :class:`LogCorruption` for anything else. The one walk behind
    :func:`read_log` (the tools keep every record) and :func:`recover` (replays each at once).

    Segments wholly below ``skip_below`` (the next one starts at or below it) are not read:
    :func:`recover` passes the snapshot's offset, since the snapshot holds their effect and
    they are only kept as the audit trail (``log_retention_bytes``, up to 100 MiB by
    default, whose reading would slow every start-up). ``pidctl log verify`` reads all.

    Each segment's bytes come from ``read_segment``: mapped by default (:func:`_mapped`),
    which only start-up may do (see :func:`_copied`)."""
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
        with (read_segment or _mapped)(path) as data:
            end = walk_segment(data, base, visit)
        if end.problem is not None:
            is_last = all(p.stat().st_size == 0 for p in paths[index + 1 :])
            if not (is_last and end.torn):
                raise LogCorruption(f"{path}: corrupt record {end.problem}")
            walked.torn_segment = path
            walked.torn_valid_bytes = end.valid_bytes
            walked.torn_tail_bytes = path.stat().st_size - end.valid_bytes
            walked.torn_tail_problem = end.problem
        if end.zero_bytes:
            walked.zero_tails.append((path, end.valid_bytes))
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
LIVE_READ_ATTEMPTS: Final = 20


LIVE_READ_PAUSE_S: Final = 0.05


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
        offset, restated = decode_snapshot(latest, latest.read_bytes())
        contents.snapshot_path = latest
        contents.snapshot_offset = offset
        contents.snapshot_entries = list(restated)
    _check_log_start(data_dir, contents.snapshot_path)
    entries: list[LogEntry] = []

    def segment_done(path: Path, base: int, end: SegmentEnd) -> None:
        scan = SegmentScan(entries.copy(), end.valid_bytes, end.problem, end.torn, end.zero_bytes)
        contents.segments.append(SegmentRead(path, base, scan))
        entries.clear()

    walked = _walk_segments(data_dir, entries.append, segment_done, progress, read_segment=_copied)
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
    if contents.snapshot_path is not None and contents.snapshot_entries is not None:
        state = _snapshot_state(
            contents.snapshot_path, contents.snapshot_offset, contents.snapshot_entries
        )
    else:
        state = ControllerState()
    replayed = 0
    for entry in contents.entries(from_offset=contents.snapshot_offset):
        try:
            state.replay(entry.offset, entry.record)
        except InvariantViolation as broken:
            raise LogCorruption(f"invariant broken: {broken}") from broken
        replayed += 1
    return state, replayed


@dataclass(slots=True)
class Recovery:
    state: ControllerState
    records_replayed: int
    snapshot_offset: int
    truncated_bytes: int
    #: The reservation file's value (None: no file; the log never reserved).
    reservation: int | None = None
    #: Bytes cut off the log's tail by this start-up or by one that stopped before saying
    #: so in the log (``DAMAGED_TAIL_FILE``); None: none. The server records it
    #: (:class:`~pidctl.controller.core.records.DamagedTailTruncated`) before serving.
    damaged_tail_bytes: int | None = None


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """A file's bytes mapped read-only: they stay in the page cache and leave this process
    when unmapped, rather than being copied onto the heap (where a big buffer is freed but
    not always given back). Only for files nobody shortens meanwhile: snapshots, and
    segments at start-up, under the data dir's lock (a live reader uses :func:`_copied`)."""
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


@contextlib.contextmanager
def _copied(path: Path) -> Iterator[memoryview]:
    """A file's bytes read into memory, for a reader beside a running server: the server
    cuts a segment's preallocated zeros off (at a roll, at a clean stop) while it may be
    read, and a mapping's pages past the file's new end fault (SIGBUS kills the reader). A
    copy is only shorter for it; the zeros cut are never records."""
    yield memoryview(path.read_bytes())


def _restore_snapshot(path: Path) -> tuple[int, ControllerState]:
    """The state in a snapshot file, its records replayed from the mapped file."""
    with _mapped(path) as data:
        offset, entries = decode_snapshot(path, data)
        return offset, _snapshot_state(path, offset, entries)


def _snapshot_state(path: Path, offset: int, entries: Iterable[LogEntry]) -> ControllerState:
    """The state a snapshot's records restate; :class:`LogCorruption` if one breaks an
    invariant."""
    try:
        return ControllerState.from_snapshot_records(
            offset, ((e.offset, e.record) for e in entries)
        )
    except InvariantViolation as broken:
        raise LogCorruption(f"{path}: bad snapshot ({broken})") from broken


def snapshot_state(contents: LogContents) -> ControllerState | None:
    """The state the data dir's snapshot holds (None: it has none), for the log tools."""
    if contents.snapshot_path is None or contents.snapshot_entries is None:
        return None
    return _snapshot_state(
        contents.snapshot_path, contents.snapshot_offset, contents.snapshot_entries
    )


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
    truncate a torn tail and remove leftovers of an interrupted snapshot. Preallocated zero
    bytes after the records are given back too (the writer preallocates afresh), so the log
    opens with every segment ending at its last record.

    Records are replayed as they are read (see :func:`_replay_streaming`), so what recovery
    leaves in memory is the state, not the history it was built from."""
    state, replayed, snapshot_offset, walked = _replay_streaming(data_dir)
    reservation = read_reservation(data_dir)
    check_reservation(data_dir, reservation, state)
    for leftover in data_dir.glob("*" + TMP_SUFFIX):
        log.warning("removing what an interrupted roll or snapshot left", file=str(leftover))
        storage_call(leftover, "unlink", leftover.unlink)
    for stray in walked.stray_segments:
        log.warning("removing an empty segment out of place", segment=str(stray))
        storage_call(stray, "unlink", stray.unlink)
    if walked.torn_segment is not None and walked.torn_tail_bytes:
        log.warning(
            "truncating torn tail",
            segment=str(walked.torn_segment),
            bytes=walked.torn_tail_bytes,
            problem=walked.torn_tail_problem,
            note="a write cut short by a crash, or damage to a synced record: grants go on "
            "above the reservation",
        )
        # Noted first: a start-up cut short after the truncation still knows of it.
        write_damaged_tail_file(data_dir, walked.torn_tail_bytes)
        _truncate(walked.torn_segment, walked.torn_valid_bytes)
    for path, records_end in walked.zero_tails:
        _truncate(path, records_end)
    return Recovery(
        state,
        replayed,
        snapshot_offset,
        walked.torn_tail_bytes,
        reservation,
        read_damaged_tail_file(data_dir),
    )


def _truncate(path: Path, size: int) -> None:
    """Cut a segment to ``size`` bytes and sync it; a failure names the file and step."""
    fd = storage_call(path, "open", os.open, path, os.O_WRONLY)
    try:
        storage_call(path, "ftruncate", os.ftruncate, fd, size)
        storage_call(path, "fsync", os.fsync, fd)
    finally:
        os.close(fd)
