"""The metadata log's writer: segments, snapshots and retention, and the group commit.

Writes go through one writer task: ``append_entry`` only buffers (it never waits), the
writer writes everything buffered in one ``write`` and one ``fdatasync``, and only then are
the appended offsets durable. Requests that arrive while a sync runs share the next one
(group commit). Where a commit runs, on the event loop or in the log's own thread, and why:
``sync_place.py``. Snapshots are written by a task of their own; segments wholly below the
newest snapshot are then deleted, beyond retention. The files' formats: ``datadir.py``;
reading them back and recovery: ``recovery.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import mypy_extensions
import structlog
import trio

from pidctl.controller.core.logformat import (
    MAX_COMMIT_BYTES,
    SEGMENT_SUFFIX,
    SNAPSHOT_SUFFIX,
    LogCorruption,
    offset_of,
    reservation_of,
    segment_name,
    snapshot_name,
)
from pidctl.controller.log.datadir import (
    RESERVATION_FILE,
    RESERVATION_NEXT_FILE,
    SEGMENT_FLAGS,
    SnapshotRecords,
    StorageFailed,
    create_segment,
    encode_reservation,
    remove_file,
    storage_call,
    took_no_byte,
    write_all,
    write_snapshot_file,
)
from pidctl.controller.log.disk_thread import DiskThread
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.log.sync_place import (
    DEFAULT_INLINE_SYNC_MAX_S,
    SyncPlace,
)

log = structlog.get_logger("pidctl.metalog")


#: Default for ``segment_max_bytes``: roll to a new segment past this size. Snapshots roll
#: segments too, so this only matters if snapshots are disabled or rare.
DEFAULT_SEGMENT_MAX_BYTES = 64 * 1024 * 1024


#: Default for ``snapshot_interval_records``: a snapshot after this many records bounds the
#: replay at start-up (0.13-0.16 s per 10,000 grant records here, compiled) whatever the
#: history's length.
#: A snapshot also waits until the log has grown by the last snapshot's size: a large state
#: (300,000 transactional ids, 12 MB) is then copied and written once per as many bytes of
#: records, not every 10,000 (an expiry of all of them made 30 snapshots in 4 s, and durable
#: requests meanwhile had 8 times the p99); Kafka spaces its snapshots by bytes too
#: (``metadata.log.max.record.bytes.between.snapshots``). Replay stays bounded by the larger
#: of the two, and costs about what reading that snapshot does.
DEFAULT_SNAPSHOT_INTERVAL_RECORDS = 10_000


#: Default for ``snapshot_min_interval_ms``: a snapshot at most this often, however fast
#: records come. Each one rolls the segment and writes, syncs and renames a file; once a
#: second (10,000 records a second: the benchmark's durable AllocateProducerIds) that held
#: the p99 at 2.86 ms against 2.37 ms with one in ten seconds (alternated rounds, the rate
#: the same). Replay at start-up is then bounded by this long's records under such a load
#: (about 1.5 ms per 100 grant records, compiled: 0.8 s for 5 s at 11,000 a second), and by
#: ``snapshot_interval_records`` under a lighter one.
DEFAULT_SNAPSHOT_MIN_INTERVAL_S = 5.0


#: Defaults for ``log_retention_bytes`` and ``log_retention_ms``: segments a snapshot covers
#: are kept as the audit trail (``pidctl log dump``), as Kafka keeps its metadata log after
#: snapshots (``metadata.max.retention.bytes`` and ``.ms``): every one for 7 days (a floor),
#: older ones while the trail is within 100 MiB.
DEFAULT_RETENTION_BYTES = 100 * 1024 * 1024


DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000


#: Default for ``log_preallocate_bytes``: zeros written ahead of the records, a chunk at a
#: time, in the active segment. A commit then overwrites blocks already on disk within the
#: file's size, and its ``fdatasync`` writes the records and nothing else; appending, it
#: also writes the inode (a new size) and, for a new block, the allocation's metadata,
#: which on the development machine made a commit's sync 1.4-1.5 times as long.
DEFAULT_PREALLOCATE_BYTES = 1024 * 1024


#: The most ``log_preallocate_bytes`` can be: one ``pwritev`` of :data:`_ZERO_CHUNK` s.
MAX_PREALLOCATE_BYTES = 64 * 1024 * 1024


#: What preallocation writes, as many times as it takes (``log_preallocate_bytes`` is
#: rounded down to whole chunks, and is at least one).
_ZERO_CHUNK = bytes(64 * 1024)
MIN_PREALLOCATE_BYTES = len(_ZERO_CHUNK)


#: Back-off while no file descriptor can be had for a reservation (commits wait meanwhile).
RESERVATION_RETRY_MIN_S = 0.05


RESERVATION_RETRY_MAX_S = 1.0


#: Errors that mean "no file descriptor now", not a failing disk: a roll or a snapshot
#: that meets one is postponed, not fatal.
_FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


#: Errors that mean "the disk is full": preallocation gives up, the records still go on.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


# Compiled (ops/compiled.py), and subclassed by what is not.
@mypy_extensions.mypyc_attr(allow_interpreted_subclasses=True)
class CommitListener:
    """The one the log tells what it has done, and the only one: as Kafka's metadata
    publishers, it sees only what is persisted. Each method is called on the event loop, in
    the writer task, and must not wait; this base does nothing."""

    def batch_written(self, records: int, size: int, seconds: float, in_thread: bool) -> None:
        """A commit of ``records`` entries (``size`` bytes) took ``seconds`` (in the log's
        thread or not)."""

    def committed(self, durable_end: int) -> None:
        """Every offset below ``durable_end`` is on disk (the waiters are woken already)."""

    def snapshot_written(self, size: int) -> None:
        """A snapshot of ``size`` bytes is on disk."""

    def audit_trail_kept(self, floor_bytes: int, retention_bytes: int) -> None:
        """After a snapshot's clean-up: the audit trail (segments the snapshot covers) holds
        ``floor_bytes`` younger than ``log_retention_ms``, kept whatever their size; more
        than ``retention_bytes`` is for an operator to see."""

    def storage_failed(self, error: StorageFailed) -> None:
        """The log failed (told once); :meth:`MetadataLog.run` raises ``error`` next."""


class MetadataLog:
    """Append records, wait for them to be durable; one writer task does all disk I/O.

    Fail-stop: after a failed write or sync (of a segment, a roll or a snapshot) nothing is
    marked durable any more, the listener is told once, and :meth:`run` raises
    :class:`StorageFailed`; waiters are never woken, so nothing more is answered. After
    each commit the listener (:class:`CommitListener`) is told of the batch, then of the
    new durable end.

    A commit's ``write`` and ``fdatasync`` run where :class:`SyncPlace` says, given
    ``inline_sync_max_s`` (``sync_place.py`` says why). Records go where the active
    segment's file ends when the log opens: open it after :func:`recovery.recover`, which
    gives back the zeros a crash left there."""

    def __init__(
        self,
        data_dir: Path,
        end_offset: int,
        snapshot_offset: int,
        snapshot_source: Callable[[], Callable[[], SnapshotRecords]],
        *,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        snapshot_interval_records: int = DEFAULT_SNAPSHOT_INTERVAL_RECORDS,
        snapshot_min_interval_s: float = 0.0,
        retention_bytes: int = DEFAULT_RETENTION_BYTES,
        retention_ms: int = DEFAULT_RETENTION_MS,
        inline_sync_max_s: float = DEFAULT_INLINE_SYNC_MAX_S,
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
        listener: CommitListener | None = None,
        reservation: int | None = None,
        before_commit: Callable[[], object] | None = None,
        durable: DurableOffsets | None = None,
    ) -> None:
        """``durable``: where the log says which offsets are on disk (built by whoever
        hands it to the log's readers before the log exists), else the log's own."""
        self.data_dir = data_dir
        self.end_offset = end_offset
        self.durable = DurableOffsets(end_offset) if durable is None else durable
        self.snapshot_offset = snapshot_offset
        self.segment_max_bytes = segment_max_bytes
        self.snapshot_interval_records = snapshot_interval_records
        self.snapshot_min_interval_s = snapshot_min_interval_s
        #: When the last snapshot began, its segment rolled (trio's clock; None: none yet).
        self._last_snapshot_at: float | None = None
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self._sync_place = SyncPlace(inline_sync_max_s)
        self.preallocate_bytes = preallocate_bytes
        self.failed: StorageFailed | None = None
        self._snapshot_source = snapshot_source
        self._listener = listener or CommitListener()
        #: Called just before a commit takes the pending records (not while shutting down):
        #: the server's decision (``server/app.py``), the log's writer only calls it.
        self._before_commit = before_commit
        self._pending: list[bytes] = []
        self._pending_event = trio.Event()
        self._closed = False
        self._snapshot_running = False
        #: The reservation file's value on disk, and the one the records appended ask for
        #: (see :meth:`append_entry`).
        self.reserved = reservation
        self._reservation_wanted = reservation
        # Held for the log's life: directory syncs never need a new descriptor.
        self._dir_fd: int = storage_call(
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
        self._size: int = storage_call(self._path, "fstat", os.fstat, self._fd).st_size
        #: The active segment's size on disk: its records (``_size``), then the zeros
        #: preallocated for the next ones (:meth:`_preallocate`).
        self._allocated = self._size
        #: Set while zeros are being written past ``_allocated`` (a commit that would reach
        #: past it waits, so that the zeros never land on records).
        self._preallocating: trio.Event | None = None
        #: Preallocation met a full disk: not tried again in this segment.
        self._preallocation_refused = False
        self._disk: DiskThread | None = None
        # Bytes of records since the newest snapshot (the segments from its offset on), and
        # its size: the next snapshot waits for as many (DEFAULT_SNAPSHOT_INTERVAL_RECORDS).
        self._bytes_since_snapshot = sum(
            _file_size(self.data_dir / segment_name(base))
            for base in self._segments
            if base >= snapshot_offset
        )
        #: The newest snapshot's size in bytes (0 before the first).
        self.snapshot_size = (
            _file_size(self.data_dir / snapshot_name(self._snapshots[-1])) if self._snapshots else 0
        )

    def _open_active_segment(self) -> tuple[Path, int]:
        if self._segments:
            path = self.data_dir / segment_name(self._segments[-1])
            return path, storage_call(path, "open", os.open, path, SEGMENT_FLAGS, 0o644)
        path = self.data_dir / segment_name(self.end_offset)
        fd = create_segment(path, self._dir_fd)
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
        pending = self._pending
        if not pending:  # (the event is set while anything is pending: see _commit_batch)
            self._pending_event.set()
        pending.append(entry)
        self.end_offset = offset + 1
        return offset

    @property
    def durable_end(self) -> int:
        """Every offset below this is on disk."""
        return self.durable.durable_end

    async def wait_durable(self, offset: int) -> None:
        """See :meth:`DurableOffsets.wait_durable`."""
        await self.durable.wait_durable(offset)

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
                        if self.failed is not None:  # nothing more is written: the failure
                            await trio.sleep_forever()  # ends this nursery meanwhile
                        await self._commit_batch(snapshots)
                finally:
                    with trio.CancelScope(shield=True):
                        while self._pending and self.failed is None:
                            await self._commit_batch(None)
        finally:
            self._closed = True
            self._disk.close()
            if self.failed is None and self._allocated > self._size:
                self._release_preallocation()
            for fd in (self._fd, self._dir_fd, self._spare_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _release_preallocation(self) -> None:
        """A clean close: the active segment ends at its last record again, as recovery
        would leave it (and as a copy of the data dir is best taken)."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as e:  # harmless: the zeros are read as the records' end
            log.warning("preallocated space not given back", segment=str(self._path), error=str(e))

    def _first_failure(self, error: StorageFailed) -> bool:
        """Whether ``error`` is the log's first failure (now told to the listener, and to be
        raised). A later one, in another task (a snapshot's, the zeros', the writer's) while
        the first is still on its way out, is only logged: one failure, one exit status
        (74), not a group of them that ends the process as a bug would."""
        if self.failed is None:
            self.failed = error
            self._listener.storage_failed(error)
            return True
        log.warning("storage failed again", error=str(error))
        return False

    async def _commit_batch(self, snapshots: trio.Nursery | None) -> None:
        if snapshots is not None and self._before_commit is not None:
            self._before_commit()
        await self._raise_reservation()
        batch, self._pending = _at_most_one_commit(self._pending)
        if not self._pending:
            self._pending_event = trio.Event()
        batch_end = self.end_offset - len(self._pending)
        data = b"".join(batch)
        self._bytes_since_snapshot += len(data)
        covered = self._bytes_since_snapshot  # through batch_end
        snapshot = None
        due = (
            batch_end - self.snapshot_offset >= self.snapshot_interval_records
            and covered >= self.snapshot_size
            and batch_end == self.end_offset  # (the state holds no record past it)
        )
        if due and snapshots is not None and not self._snapshot_running and self._spaced():
            # Captured now, while state and log agree on batch_end (no await since the last
            # append); the source returns a cheap copy, turned into the snapshot in a thread.
            snapshot = self._snapshot_source()
        # (Nobody waits for this batch when nobody waits past what is durable already.)
        in_thread = self._sync_place.in_thread_for(awaited=self.durable.waited_on())
        if self._size + len(data) > self._allocated and self._preallocating is not None:
            with trio.CancelScope(shield=True):  # the batch is taken: it must be written
                await self._preallocating.wait()
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
            self._allocated = max(self._allocated, size)
            self._sync_place.after(took)
            self._after_batch(len(batch), len(data), took, in_thread, batch_end)
            lowered = self._reservation_wanted
            if lowered is not None and self.reserved is not None and lowered < self.reserved:
                await self._reserve(lowered, in_thread=True)
            if snapshot is not None and snapshots is not None:
                # Roll first, so that a snapshot at batch_end always has a segment there.
                # (Rolls are rare: a worker thread of trio's, as the snapshots.)
                if await self._roll_soon(batch_end):  # (else postponed: the next commit tries)
                    self._snapshot_running = True
                    self._last_snapshot_at = trio.current_time()
                    snapshots.start_soon(self._write_snapshot, batch_end, snapshot, covered)
            elif size >= self.segment_max_bytes:
                await self._roll_soon(batch_end)
            elif snapshots is not None:
                self._preallocate_soon(snapshots)
        except StorageFailed as e:
            if self._first_failure(e):  # at once: /readyz fails before anything else happens
                raise

    def _spaced(self) -> bool:
        """Whether ``snapshot_min_interval_s`` has passed since the last snapshot began."""
        last = self._last_snapshot_at
        return last is None or trio.current_time() - last >= self.snapshot_min_interval_s

    async def _roll_soon(self, base_offset: int) -> bool:
        """:meth:`_roll` in a worker thread, once no zeros are being written to the segment
        it ends."""
        with trio.CancelScope(shield=True):
            if self._preallocating is not None:
                await self._preallocating.wait()
            rolled: bool = await trio.to_thread.run_sync(self._roll, base_offset)
        return rolled

    def _preallocate_soon(self, nursery: trio.Nursery) -> None:
        """After a commit: when less than half of ``preallocate_bytes`` is left ahead of the
        records, write the next chunk of zeros, in a worker thread (one at a time)."""
        # Never past where the segment rolls.
        length = min(self.preallocate_bytes, self.segment_max_bytes - self._allocated)
        if (
            self._preallocating is not None
            or self._preallocation_refused
            or self._allocated - self._size >= self.preallocate_bytes // 2
            or length < len(_ZERO_CHUNK)
        ):
            return
        if not self._sync_place.in_thread_for(awaited=False):  # nobody waits for the zeros
            # On the loop only where SyncPlace keeps everything there (trio's mock clock).
            end = _write_zeros(self._path, self._allocated, length)
            self._allocated = self._allocated if end is None else max(self._allocated, end)
            self._preallocation_refused = end is None
            return
        self._preallocating = trio.Event()
        nursery.start_soon(self._preallocate, self._path, self._allocated, length)

    async def _preallocate(self, path: Path, start: int, length: int) -> None:
        # Shielded: the writer waits for it to end before it rolls or closes the segment.
        with trio.CancelScope(shield=True):
            try:
                end = await trio.to_thread.run_sync(_write_zeros, path, start, length)
                if end is None:
                    self._preallocation_refused = True
                else:
                    self._allocated = max(self._allocated, end)
            except StorageFailed as e:
                if self._first_failure(e):
                    raise
            finally:
                done, self._preallocating = self._preallocating, None
                if done is not None:
                    done.set()

    async def _raise_reservation(self) -> None:
        """Make the reservation the pending records ask for durable before they are written.
        With no file descriptor for it (EMFILE, and none opened ahead), the commit waits and
        tries again. Records appended while a reservation is written (in the log's thread)
        may ask for a higher one: it returns only when the file holds what every pending
        record asks for, and the commit takes them with no wait in between."""
        delay = RESERVATION_RETRY_MIN_S
        while True:
            if self.failed is not None:  # failed meanwhile: the failure ends the writer
                await trio.sleep_forever()
            wanted = self._reservation_wanted
            if wanted is None or (self.reserved is not None and wanted <= self.reserved):
                return
            if await self._reserve(wanted, self._sync_place.in_thread):
                delay = RESERVATION_RETRY_MIN_S
                continue  # (see whether what came meanwhile asks for more)
            if self.failed is not None:  # not postponed: the log failed meanwhile
                continue
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
            if self._first_failure(e):
                raise
            return False  # (the writer stops at its next wait, cancelled by the failure)
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
            write_all(spare, fd, encode_reservation(value), 0)
            storage_call(spare, "fsync", os.fsync, fd)
        finally:
            os.close(fd)
        path = self.data_dir / RESERVATION_FILE
        storage_call(path, "rename", os.replace, spare, path)
        storage_call(self.data_dir, "fsync", os.fsync, self._dir_fd)
        self._open_spare()
        return True

    def _open_spare(self) -> bool:
        """Open (empty) the file the next reservation is written into; False on EMFILE."""
        spare = self.data_dir / RESERVATION_NEXT_FILE
        try:
            self._spare_fd = storage_call(
                spare, "open", os.open, spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("no file descriptor for the next reservation yet", error=e.errno_name)
            return False
        return True

    def _after_batch(
        self, records: int, size: int, took: float, in_thread: bool, batch_end: int
    ) -> None:
        listener = self._listener
        listener.batch_written(records, size, took, in_thread)
        self.durable.advance(batch_end)
        listener.committed(batch_end)

    async def _write_snapshot(
        self, offset: int, records: Callable[[], SnapshotRecords], covered: int
    ) -> None:
        """Write the snapshot at ``offset``, which covers ``covered`` bytes of records."""
        # Shielded: a snapshot that has started is finished even during shutdown.
        with trio.CancelScope(shield=True):
            try:
                written = await trio.to_thread.run_sync(self._snapshot_and_clean, offset, records)
                if written is not None:
                    size, kept = written
                    self.snapshot_offset = offset
                    self._bytes_since_snapshot -= covered
                    self.snapshot_size = size
                    self._listener.snapshot_written(size)
                    self._listener.audit_trail_kept(kept, self.retention_bytes)
            except StorageFailed as e:
                if self._first_failure(e):
                    raise
            finally:
                self._snapshot_running = False

    def _write_and_sync(self, data: bytes) -> int:
        """Append ``data`` and make it durable; the segment's size after it."""
        self._size += write_all(self._path, self._fd, data, self._size)
        storage_call(self._path, "fdatasync", os.fdatasync, self._fd)
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
            fd = create_segment(path, self._dir_fd)
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("segment roll postponed", segment=str(path), error=e.errno_name)
            return False
        old, old_path, size, allocated = self._fd, self._path, self._size, self._allocated
        self._fd, self._path, self._size, self._allocated = fd, path, 0, 0
        self._preallocation_refused = False
        self._segments.append(base_offset)
        try:
            if allocated > size:
                # The zeros past its records go: a segment rolled from is its records.
                storage_call(old_path, "ftruncate", os.ftruncate, old, size)
        finally:
            os.close(old)
        return True

    def _snapshot_and_clean(
        self, offset: int, records: Callable[[], SnapshotRecords]
    ) -> tuple[int, int] | None:
        """Write the snapshot at ``offset``, then delete what it covers; its size and the
        audit trail's bytes kept (:meth:`_delete_covered_segments`), None if postponed.

        Only the snapshot's temporary file needs a new file descriptor (the directory is
        synced through the log's own), and it is the first step: without one (EMFILE) the
        snapshot is postponed with nothing changed, and taken again after the next batch."""
        try:
            path = write_snapshot_file(self.data_dir, offset, records(), self._dir_fd)
        except StorageFailed as e:
            if e.errno not in _FD_EXHAUSTED:
                raise
            log.warning("snapshot postponed", offset=offset, error=e.errno_name)
            return None
        size: int = storage_call(path, "stat", os.stat, path).st_size
        older, self._snapshots = [o for o in self._snapshots if o < offset], [offset]
        for old in older:
            remove_file(self.data_dir / snapshot_name(old))
        kept = self._delete_covered_segments(offset)
        storage_call(self.data_dir, "fsync", os.fsync, self._dir_fd)
        log.info("snapshot written", offset=offset, bytes=size)
        return size, kept

    def _delete_covered_segments(self, offset: int) -> int:
        """Segments wholly below the snapshot are not needed for recovery; the newest of
        them are kept as the audit trail for `pidctl log dump`. ``retention_ms`` is a floor:
        a segment whose last write is younger is kept whatever the bytes, so that no burst
        of records (a client sending large client ids, say) pushes the trail below it.
        Older segments are kept while the trail stays within ``retention_bytes``; the rest
        go, oldest first, so a crash midway never leaves a gap between segments. Returns
        the bytes within the floor (above ``retention_bytes``: reported, never cut)."""
        covered = [base for base in self._segments if base < offset]
        kept = young = 0
        now = time.time()
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
            if (now - st.st_mtime) * 1000 < self.retention_ms:
                young += st.st_size
            elif kept > self.retention_bytes:
                for old in covered[: index + 1]:  # this one and every older one
                    remove_file(self.data_dir / segment_name(old))
                    self._segments.remove(old)
                break
        return young


def _at_most_one_commit(pending: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The entries the next commit writes, and those left for the one after: no more than
    :data:`MAX_COMMIT_BYTES` (an entry fits alone), so that a power cut mid-commit leaves
    intact records no further than recovery looks for them (``logformat.walk_segment``)."""
    total = 0
    for index, entry in enumerate(pending):
        total += len(entry)
        if total > MAX_COMMIT_BYTES and index > 0:
            return pending[:index], pending[index:]
    return pending, []


def _file_size(path: Path) -> int:
    return int(storage_call(path, "stat", os.stat, path).st_size)


def _write_zeros(path: Path, start: int, length: int) -> int | None:
    """Write ``length`` bytes of zeros (whole chunks) at ``start`` (the segment's end),
    synced; where they end, or None when the disk is full (records still fit where zeros
    do not; the segment goes on without). Through a descriptor of its own: a write-back
    error is then told to the commits' ``fdatasync`` as well as to this one (each open
    file learns of it once), so no commit is acknowledged past it."""
    try:
        fd: int = storage_call(path, "open", os.open, path, os.O_WRONLY)
    except StorageFailed as e:
        if e.errno not in _FD_EXHAUSTED:
            raise
        return start  # no descriptor now: tried again after the next commit
    try:
        chunks = [_ZERO_CHUNK] * (length // len(_ZERO_CHUNK))
        written: int = storage_call(path, "preallocate", os.pwritev, fd, chunks, start)
        if written == 0:  # as a record write taking none
            raise took_no_byte(path, "preallocate")
        storage_call(path, "fdatasync", os.fdatasync, fd)
    except StorageFailed as e:
        if e.errno not in _DISK_FULL or e.operation != "preallocate":
            raise
        log.warning(
            "preallocation refused",
            note="the segment grows as it is written, until the next one",
            segment=str(path),
            error=e.errno_name,
        )
        return None
    finally:
        os.close(fd)
    return start + written
