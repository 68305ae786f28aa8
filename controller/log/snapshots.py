"""When the metadata log takes a snapshot, writing it, and what it lets go.

A snapshot is due once the log has ``snapshot_interval_records`` records past the newest
one and has grown by that snapshot's size (so a large state is written once per as many
bytes of records), and at most every ``snapshot_min_interval_s``. The log's writer takes
its copy of the state at the instant of a commit; it is written by a task of its own, so
commits go on meanwhile. Then the older snapshots go, and the segments wholly below it
beyond retention (the rest are the audit trail, ``pidctl log dump``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

import structlog
import trio

from pidctl.controller.core.logformat import segment_name, snapshot_name
from pidctl.controller.log.datadir import (
    SnapshotRecords,
    StorageFailed,
    out_of_descriptors,
    remove_file,
    storage_call,
    write_snapshot_file,
)
from pidctl.controller.log.fail_stop import FailStop

log: Final = structlog.get_logger("pidctl.metalog")


class SnapshotListener(Protocol):
    """What the log's listener is told of snapshots (``metalog.CommitListener``)."""

    def snapshot_written(self, size: int) -> None: ...

    def audit_trail_kept(self, floor_bytes: int, retention_bytes: int) -> None: ...


#: Default for ``snapshot_interval_records``: a snapshot after this many records bounds the
#: replay at start-up (0.13-0.16 s per 10,000 grant records here, compiled) whatever the
#: history's length.
#: A snapshot also waits until the log has grown by the last snapshot's size: a large state
#: (300,000 transactional ids, 12 MB) is then copied and written once per as many bytes of
#: records, not every 10,000 (an expiry of all of them made 30 snapshots in 4 s, and durable
#: requests meanwhile had 8 times the p99); Kafka spaces its snapshots by bytes too
#: (``metadata.log.max.record.bytes.between.snapshots``). Replay stays bounded by the larger
#: of the two, and costs about what reading that snapshot does.
DEFAULT_SNAPSHOT_INTERVAL_RECORDS: Final = 10_000


#: Default for ``snapshot_min_interval_ms``: a snapshot at most this often, however fast
#: records come. Each one rolls the segment and writes, syncs and renames a file; once a
#: second (10,000 records a second: the benchmark's durable AllocateProducerIds) that held
#: the p99 at 2.86 ms against 2.37 ms with one in ten seconds (alternated rounds, the rate
#: the same). Replay at start-up is then bounded by this long's records under such a load
#: (about 1.5 ms per 100 grant records, compiled: 0.8 s for 5 s at 11,000 a second), and by
#: ``snapshot_interval_records`` under a lighter one.
DEFAULT_SNAPSHOT_MIN_INTERVAL_S: Final = 5.0


#: Defaults for ``log_retention_bytes`` and ``log_retention_ms``: segments a snapshot covers
#: are kept as the audit trail (``pidctl log dump``), as Kafka keeps its metadata log after
#: snapshots (``metadata.max.retention.bytes`` and ``.ms``): every one for 7 days (a floor),
#: older ones while the trail is within 100 MiB.
DEFAULT_RETENTION_BYTES: Final = 100 * 1024 * 1024


DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000


class SnapshotSettings:
    """How often snapshots are taken, and how much of the log they cover is kept."""

    def __init__(
        self, interval_records: int, min_interval_s: float, retention_bytes: int, retention_ms: int
    ) -> None:
        self.interval_records = interval_records
        self.min_interval_s = min_interval_s
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms


class Snapshots:
    """The newest snapshot (:attr:`offset`, :attr:`size`), the bytes of records since it,
    and the one being written."""

    def __init__(
        self,
        data_dir: Path,
        dir_fd: int,
        offset: int,
        on_disk: list[int],
        segments: list[int],
        settings: SnapshotSettings,
        listener: SnapshotListener,
        fail_stop: FailStop,
    ) -> None:
        """``on_disk``: the snapshots in the data dir by offset, oldest first; ``segments``
        the log's segments, the same list the log rolls into (a snapshot deletes from it)."""
        self.data_dir = data_dir
        self._dir_fd = dir_fd
        self.offset = offset
        self._on_disk = on_disk
        self._segments = segments
        self.settings = settings
        self._listener = listener
        self._fail_stop = fail_stop
        #: When the last snapshot began, its segment rolled (trio's clock; None: none yet).
        self._last_at: float | None = None
        self.running = False
        # Bytes of records since the newest snapshot (the segments from its offset on), and
        # its size: the next snapshot waits for as many (DEFAULT_SNAPSHOT_INTERVAL_RECORDS).
        self.bytes_since = sum(
            file_size(data_dir / segment_name(base)) for base in segments if base >= offset
        )
        #: The newest snapshot's size in bytes (0 before the first).
        self.size = file_size(data_dir / snapshot_name(on_disk[-1])) if on_disk else 0

    def appended(self, size: int) -> None:
        """The log appended ``size`` bytes of records: the next snapshot covers them."""
        self.bytes_since += size

    def due(self, batch_end: int) -> bool:
        """Whether a snapshot at ``batch_end`` (everything appended so far) is to be taken
        now (none is being written, and the last began long enough ago)."""
        settings = self.settings
        return (
            batch_end - self.offset >= settings.interval_records
            and self.bytes_since >= self.size
            and not self.running
            and self._spaced()
        )

    def _spaced(self) -> bool:
        """Whether ``snapshot_min_interval_s`` has passed since the last snapshot began."""
        last = self._last_at
        return last is None or trio.current_time() - last >= self.settings.min_interval_s

    def start(
        self,
        nursery: trio.Nursery,
        offset: int,
        records: Callable[[], SnapshotRecords],
    ) -> None:
        """Write the snapshot at ``offset`` (its segment rolled; everything appended so far),
        in a task of its own."""
        self.running = True
        self._last_at = trio.current_time()
        nursery.start_soon(self._write, offset, records, self.bytes_since)

    async def _write(
        self, offset: int, records: Callable[[], SnapshotRecords], covered: int
    ) -> None:
        """Write the snapshot at ``offset``, which covers ``covered`` bytes of records."""
        # Shielded: a snapshot that has started is finished even during shutdown.
        with trio.CancelScope(shield=True):
            try:
                written = await trio.to_thread.run_sync(self._write_and_clean, offset, records)
                if written is not None:
                    size, kept = written
                    self.offset = offset
                    self.bytes_since -= covered
                    self.size = size
                    self._listener.snapshot_written(size)
                    self._listener.audit_trail_kept(kept, self.settings.retention_bytes)
            except StorageFailed as e:
                if self._fail_stop.first(e):
                    raise
            finally:
                self.running = False

    def _write_and_clean(
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
            if not out_of_descriptors(e):
                raise
            log.warning("snapshot postponed", offset=offset, error=e.errno_name)
            return None
        size: int = storage_call(path, "stat", os.stat, path).st_size
        older, self._on_disk = [o for o in self._on_disk if o < offset], [offset]
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
        settings = self.settings
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
            if (now - st.st_mtime) * 1000 < settings.retention_ms:
                young += st.st_size
            elif kept > settings.retention_bytes:
                for old in covered[: index + 1]:  # this one and every older one
                    remove_file(self.data_dir / segment_name(old))
                    self._segments.remove(old)
                break
        return young


def file_size(path: Path) -> int:
    return int(storage_call(path, "stat", os.stat, path).st_size)
