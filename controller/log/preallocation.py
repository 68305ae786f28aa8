"""Zeros written ahead of the records in the active segment, a chunk at a time.

A commit then overwrites blocks already on disk within the file's size, and its
``fdatasync`` writes the records and nothing else; appending, it also writes the inode (a
new size) and, for a new block, the allocation's metadata, which on the development machine
made a commit's sync 1.4-1.5 times as long. The zeros are written in a worker thread after a
commit, when less than half of ``log_preallocate_bytes`` is left ahead of the records; a
commit that would reach past them waits for them, so that zeros never land on records.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Final

import structlog
import trio

from pidctl.controller.log.datadir import (
    StorageFailed,
    out_of_descriptors,
    storage_call,
    took_no_byte,
)
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.sync_place import SyncPlace

log: Final = structlog.get_logger("pidctl.metalog")

#: Default for ``log_preallocate_bytes``: zeros written ahead of the records, a chunk at a
#: time, in the active segment (the module says why).
DEFAULT_PREALLOCATE_BYTES: Final = 1024 * 1024


#: The most ``log_preallocate_bytes`` can be: one ``pwritev`` of :data:`_ZERO_CHUNK` s.
MAX_PREALLOCATE_BYTES: Final = 64 * 1024 * 1024


#: What preallocation writes, as many times as it takes (``log_preallocate_bytes`` is
#: rounded down to whole chunks, and is at least one).
_ZERO_CHUNK: Final = bytes(64 * 1024)
MIN_PREALLOCATE_BYTES: Final = len(_ZERO_CHUNK)


#: Errors that mean "the disk is full": preallocation gives up, the records still go on.
_DISK_FULL: Final = (errno.ENOSPC, errno.EDQUOT)


class Preallocation:
    """The active segment's size on disk (:attr:`allocated`: its records, then the zeros
    written ahead of them) and the zeros being written, one chunk at a time."""

    def __init__(
        self,
        allocated: int,
        preallocate_bytes: int,
        segment_max_bytes: int,
        sync_place: SyncPlace,
        fail_stop: FailStop,
    ) -> None:
        self.allocated = allocated
        self.preallocate_bytes = preallocate_bytes
        self.segment_max_bytes = segment_max_bytes
        self._sync_place = sync_place
        self._fail_stop = fail_stop
        #: Set while zeros are being written past ``allocated`` (a commit that would reach
        #: past it waits, so that the zeros never land on records).
        self.running: trio.Event | None = None
        #: Preallocation met a full disk: not tried again in this segment.
        self._refused = False

    async def wait(self) -> None:
        """Until no zeros are being written (shielded: what waits must go on after)."""
        if self.running is not None:
            with trio.CancelScope(shield=True):
                await self.running.wait()

    def rolled(self) -> None:
        """A new, empty segment is active."""
        self.allocated = 0
        self._refused = False

    def soon(self, nursery: trio.Nursery, path: Path, size: int) -> None:
        """After a commit (the segment at ``path`` holds ``size`` bytes of records): when
        less than half of ``preallocate_bytes`` is left ahead of the records, write the next
        chunk of zeros, in a worker thread (one at a time)."""
        # Never past where the segment rolls.
        length = min(self.preallocate_bytes, self.segment_max_bytes - self.allocated)
        if (
            self.running is not None
            or self._refused
            or self.allocated - size >= self.preallocate_bytes // 2
            or length < len(_ZERO_CHUNK)
        ):
            return
        if not self._sync_place.in_thread_for(awaited=False):  # nobody waits for the zeros
            # On the loop only where SyncPlace keeps everything there (trio's mock clock).
            end = _write_zeros(path, self.allocated, length)
            self.allocated = self.allocated if end is None else max(self.allocated, end)
            self._refused = end is None
            return
        self.running = trio.Event()
        nursery.start_soon(self._preallocate, path, self.allocated, length)

    async def _preallocate(self, path: Path, start: int, length: int) -> None:
        # Shielded: the writer waits for it to end before it rolls or closes the segment.
        with trio.CancelScope(shield=True):
            try:
                end = await trio.to_thread.run_sync(_write_zeros, path, start, length)
                if end is None:
                    self._refused = True
                else:
                    self.allocated = max(self.allocated, end)
            except StorageFailed as e:
                if self._fail_stop.first(e):
                    raise
            finally:
                done, self.running = self.running, None
                if done is not None:
                    done.set()

    def release(self, path: Path, fd: int, size: int) -> None:
        """A clean close: the active segment ends at its last record (``size``) again, as
        recovery would leave it (and as a copy of the data dir is best taken)."""
        if self.allocated <= size:
            return
        try:
            os.ftruncate(fd, size)
        except OSError as e:  # harmless: the zeros are read as the records' end
            log.warning("preallocated space not given back", segment=str(path), error=str(e))


def _write_zeros(path: Path, start: int, length: int) -> int | None:
    """Write ``length`` bytes of zeros (whole chunks) at ``start`` (the segment's end),
    synced; where they end, or None when the disk is full (records still fit where zeros
    do not; the segment goes on without). Through a descriptor of its own: a write-back
    error is then told to the commits' ``fdatasync`` as well as to this one (each open
    file learns of it once), so no commit is acknowledged past it."""
    try:
        fd: int = storage_call(path, "open", os.open, path, os.O_WRONLY)
    except StorageFailed as e:
        if not out_of_descriptors(e):
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
