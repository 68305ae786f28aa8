"""The metadata log's writer: segments, snapshots and retention, and the group commit.

Writes go through one writer task: ``append_entry`` only buffers (it never waits), the
writer writes everything buffered in one ``write`` and one ``fdatasync``, and only then are
the appended offsets durable. Requests that arrive while a sync runs share the next one
(group commit). Where a commit runs, on the event loop or in the log's own thread, and why:
``sync_place.py``. What the writer schedules besides has rooms of its own: when a snapshot
is due, writing it and the retention after it (``snapshots.py``), the zeros written ahead of
the records (``preallocation.py``), the reservation file (``reservation_file.py``); the
first storage failure (``fail_stop.py``); the durable end and who waits for it
(``durable.py``). The files' formats: ``datadir.py``; reading them back and recovery:
``recovery.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

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
)
from pidctl.controller.log.datadir import (
    SEGMENT_FLAGS,
    SnapshotRecords,
    StorageFailed,
    create_segment,
    out_of_descriptors,
    storage_call,
    write_all,
)
from pidctl.controller.log.disk_thread import DiskThread
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.preallocation import DEFAULT_PREALLOCATE_BYTES, Preallocation
from pidctl.controller.log.reservation_file import ReservationFile
from pidctl.controller.log.snapshots import (
    DEFAULT_RETENTION_BYTES,
    DEFAULT_RETENTION_MS,
    DEFAULT_SNAPSHOT_INTERVAL_RECORDS,
    Snapshots,
    SnapshotSettings,
)
from pidctl.controller.log.sync_place import (
    DEFAULT_INLINE_SYNC_MAX_S,
    SyncPlace,
)

log: Final = structlog.get_logger("pidctl.metalog")


#: Default for ``segment_max_bytes``: roll to a new segment past this size. Snapshots roll
#: segments too, so this only matters if snapshots are disabled or rare.
DEFAULT_SEGMENT_MAX_BYTES: Final = 64 * 1024 * 1024


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
        # (Everything the log holds at start is durable: one offset, from two places.)
        assert self.durable.durable_end == end_offset, "durable offsets begin at the log's end"
        self.segment_max_bytes = segment_max_bytes
        self._sync_place = SyncPlace(inline_sync_max_s)
        self._snapshot_source = snapshot_source
        self._listener = listener or CommitListener()
        self._fail_stop = FailStop(self._listener.storage_failed)
        #: Called just before a commit takes the pending records (not while shutting down):
        #: the server's decision (``server/rooms.py``), the log's writer only calls it.
        self._before_commit = before_commit
        self._pending: list[bytes] = []
        self._pending_event = trio.Event()
        self._closed = False
        # Held for the log's life: directory syncs never need a new descriptor.
        self._dir_fd: int = storage_call(
            data_dir, "open", os.open, data_dir, os.O_RDONLY | os.O_DIRECTORY
        )
        self._reservations = ReservationFile(data_dir, self._dir_fd, reservation, self._fail_stop)
        # The segments and snapshots in the data dir, by offset, oldest first: listed once
        # here, then kept by the log (the only writer: the data dir is locked), so that
        # cleaning up after a snapshot needs no file descriptor to list the directory.
        self._segments = sorted(offset_of(p) for p in data_dir.glob("*" + SEGMENT_SUFFIX))
        snapshots = sorted(offset_of(p) for p in data_dir.glob("*" + SNAPSHOT_SUFFIX))
        self._path, self._fd = self._open_active_segment()
        # Kept here rather than asked of the file after every commit (the log is the only
        # writer of its active segment: the data dir is locked).
        self._size: int = storage_call(self._path, "fstat", os.fstat, self._fd).st_size
        self._preallocation = Preallocation(
            self._size, preallocate_bytes, segment_max_bytes, self._sync_place, self._fail_stop
        )
        self._disk: DiskThread | None = None
        self.snapshots = Snapshots(
            data_dir,
            self._dir_fd,
            snapshot_offset,
            snapshots,
            self._segments,
            SnapshotSettings(
                snapshot_interval_records, snapshot_min_interval_s, retention_bytes, retention_ms
            ),
            self._listener,
            self._fail_stop,
        )

    @property
    def snapshot_offset(self) -> int:
        """The newest snapshot's offset."""
        return self.snapshots.offset

    @property
    def snapshot_size(self) -> int:
        """The newest snapshot's size in bytes (0 before the first)."""
        return self.snapshots.size

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
        if self._closed or self._fail_stop.failed is not None:
            raise RuntimeError("metadata log is closed")
        reservation = reservation_of(entry)
        if reservation is not None:
            self._reservations.ask(reservation)
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
        fail_stop = self._fail_stop
        try:
            async with trio.open_nursery() as snapshots:
                try:
                    while True:
                        await self._pending_event.wait()
                        if fail_stop.failed is not None:  # nothing more is written: the
                            await trio.sleep_forever()  # failure ends this nursery meanwhile
                        await self._commit_batch(snapshots)
                finally:
                    with trio.CancelScope(shield=True):
                        while self._pending and fail_stop.failed is None:
                            await self._commit_batch(None)
        finally:
            self._closed = True
            self._disk.close()
            if fail_stop.failed is None:
                self._preallocation.release(self._path, self._fd, self._size)
            for fd in (self._fd, self._dir_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._reservations.close()

    async def _commit_batch(self, snapshots: trio.Nursery | None) -> None:
        if snapshots is not None and self._before_commit is not None:
            self._before_commit()
        disk = self._disk
        assert disk is not None
        await self._reservations.raise_to_wanted(disk, self._sync_place)
        batch, self._pending = _at_most_one_commit(self._pending)
        if not self._pending:
            self._pending_event = trio.Event()
        batch_end = self.end_offset - len(self._pending)
        data = b"".join(batch)
        schedule = self.snapshots
        schedule.appended(len(data))
        snapshot = None
        if (
            batch_end == self.end_offset  # (the state holds no record past it)
            and snapshots is not None
            and schedule.due(batch_end)
        ):
            # Captured now, while state and log agree on batch_end (no await since the last
            # append); the source returns a cheap copy, turned into the snapshot in a thread.
            snapshot = self._snapshot_source()
        # (Nobody waits for this batch when nobody waits past what is durable already.)
        in_thread = self._sync_place.in_thread_for(awaited=self.durable.waited_on())
        preallocation = self._preallocation
        if self._size + len(data) > preallocation.allocated and preallocation.running is not None:
            await preallocation.wait()  # (the batch is taken: it must be written)
        started = trio.current_time()
        # Not cancellable: a sync in progress must finish before anyone is told the outcome.
        try:
            if in_thread:
                size = await disk.call(self._write_and_sync, data)
            else:
                size = self._write_and_sync(data)
            took = trio.current_time() - started
            preallocation.allocated = max(preallocation.allocated, size)
            self._sync_place.after(took)
            self._after_batch(len(batch), len(data), took, in_thread, batch_end)
            if self._reservations.lowered():
                await self._reservations.lower(disk)
            if snapshot is not None and snapshots is not None:
                # Roll first, so that a snapshot at batch_end always has a segment there.
                # (Rolls are rare: a worker thread of trio's, as the snapshots.)
                if await self._roll_soon(batch_end):  # (else postponed: the next commit tries)
                    schedule.start(snapshots, batch_end, snapshot)
            elif size >= self.segment_max_bytes:
                await self._roll_soon(batch_end)
            elif snapshots is not None:
                preallocation.soon(snapshots, self._path, self._size)
        except StorageFailed as e:
            if self._fail_stop.first(e):  # at once: /readyz fails before anything else happens
                raise

    async def _roll_soon(self, base_offset: int) -> bool:
        """:meth:`_roll` in a worker thread, once no zeros are being written to the segment
        it ends."""
        with trio.CancelScope(shield=True):
            await self._preallocation.wait()
            rolled: bool = await trio.to_thread.run_sync(self._roll, base_offset)
        return rolled

    def _after_batch(
        self, records: int, size: int, took: float, in_thread: bool, batch_end: int
    ) -> None:
        listener = self._listener
        listener.batch_written(records, size, took, in_thread)
        self.durable.advance(batch_end)
        listener.committed(batch_end)

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
            if not out_of_descriptors(e):
                raise
            log.warning("segment roll postponed", segment=str(path), error=e.errno_name)
            return False
        old, old_path, size = self._fd, self._path, self._size
        allocated = self._preallocation.allocated
        self._fd, self._path, self._size = fd, path, 0
        self._preallocation.rolled()
        self._segments.append(base_offset)
        try:
            if allocated > size:
                # The zeros past its records go: a segment rolled from is its records.
                storage_call(old_path, "ftruncate", os.ftruncate, old, size)
        finally:
            os.close(old)
        return True


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
