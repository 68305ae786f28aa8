"""The metadata log's writer: group commits, snapshots, retention, and the reservation it
keeps ahead of the grants (each checked by recovering what it wrote)."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from pidctl.controller.core.logformat import (
    MAX_COMMIT_BYTES,
    LogCorruption,
    encode_entry,
    offset_of,
    scan_segment,
    segment_name,
)
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    ProducerIdsGranted,
    ProducerIdsReserved,
    Record,
    TransactionalIdUpdated,
)
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.datadir import (
    read_reservation,
)
from pidctl.controller.log.metalog import CommitListener, MetadataLog
from pidctl.controller.log.recovery import read_log, recover
from tests.controller.server.conftest import until


class Listener(CommitListener):
    """Tells a test's functions what the log did."""

    def __init__(
        self,
        batch: Callable[[int, float, bool], object] | None = None,
        committed: Callable[[int], object] | None = None,
        snapshot: Callable[[int], object] | None = None,
    ) -> None:
        self._batch, self._committed, self._snapshot = batch, committed, snapshot

    def batch_written(self, records: int, size: int, seconds: float, in_thread: bool) -> None:
        if self._batch is not None:
            self._batch(records, seconds, in_thread)

    def committed(self, durable_end: int) -> None:
        if self._committed is not None:
            self._committed(durable_end)

    def snapshot_written(self, size: int) -> None:
        if self._snapshot is not None:
            self._snapshot(size)


def append(metalog: MetadataLog, record: Record) -> int:
    """Buffer one record as :meth:`QuorumController.apply` does (encoded for the next offset)."""
    return metalog.append_entry(encode_entry(metalog.end_offset, 0, record))


def grant(n: int) -> ProducerIdsGranted:
    return ProducerIdsGranted(1, 1, n * 1000, (n + 1) * 1000)


def history(grants: int) -> list[Record]:
    return [ClusterCreated("c", 1), BrokerRegistered(1, "inc", 1), *map(grant, range(grants))]


def write_segment(data_dir: Path, records: list[Record], base: int = 0) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / segment_name(base)
    path.write_bytes(b"".join(encode_entry(base + i, 1000 + i, r) for i, r in enumerate(records)))
    return path


def digest(data_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data_dir.iterdir()}


async def run_log(
    data_dir: Path,
    records: list[Record],
    snapshot_interval_records: int = 10_000,
    retention_bytes: int = 0,
    retention_ms: int = 0,
) -> ControllerState:
    """Write records through the real MetadataLog, as the server does (without an audit
    trail, unless told)."""
    state = ControllerState()
    metalog = MetadataLog(
        data_dir,
        0,
        0,
        lambda: state.copy().snapshot_records,
        snapshot_interval_records=snapshot_interval_records,
        retention_bytes=retention_bytes,
        retention_ms=retention_ms,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in records:
            state.replay(append(metalog, record), record)
        await metalog.flush()
        nursery.cancel_scope.cancel()
    return state


@pytest.mark.parametrize(("inline_sync_max_s", "in_thread"), [(60.0, False), (0.0, True)])
async def test_commits_run_on_the_loop_while_syncs_are_quick_or_always_in_the_thread(
    tmp_path: Path, inline_sync_max_s: float, in_thread: bool
) -> None:
    where: list[bool] = []
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        inline_sync_max_s=inline_sync_max_s,
        listener=Listener(batch=lambda _records, _seconds, thread: where.append(thread)),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in history(20):
            offset = append(metalog, record)
            state.replay(offset, record)
            await metalog.wait_durable(offset)
        nursery.cancel_scope.cancel()
    assert where == [in_thread] * 22
    assert recover(tmp_path).state == state


async def test_a_commit_nobody_waits_for_runs_in_the_thread_however_quick_the_disk(
    tmp_path: Path,
) -> None:
    """A record nobody waits for (a prefetched block's grant) is committed in the log's
    thread, one somebody waits for on the loop (syncs quick: a minute's threshold); a wait
    said before the commit starts (an answer held for it: ``awaited``) counts as one."""
    where: list[bool] = []
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        inline_sync_max_s=60.0,
        listener=Listener(batch=lambda _records, _seconds, thread: where.append(thread)),
    )
    records = iter(history(3))

    def next_record() -> int:
        record = next(records)
        offset = append(metalog, record)
        state.replay(offset, record)
        return offset

    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await metalog.wait_durable(next_record())  # waited for: on the loop
        unawaited = next_record()
        with trio.fail_after(10):
            while metalog.durable_end <= unawaited:  # nobody waits: the thread
                await trio.sleep(0.001)
        metalog.durable.awaited(next_record())  # an answer held for it: on the loop
        await metalog.wait_durable(metalog.end_offset - 1)
        nursery.cancel_scope.cancel()
    assert where == [False, True, False]
    assert recover(tmp_path).state == state


async def test_under_an_infinite_threshold_every_commit_runs_on_the_loop(tmp_path: Path) -> None:
    """What tests under trio's mock clock use: no thread, even for a commit nobody waits
    for (the clock would jump while the thread works)."""
    where: list[bool] = []
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        inline_sync_max_s=math.inf,
        listener=Listener(batch=lambda _records, _seconds, thread: where.append(thread)),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in history(2):
            state.replay(append(metalog, record), record)
            await trio.sleep(0.001)
        await metalog.flush()
        nursery.cancel_scope.cancel()
    assert where and not any(where)


async def test_a_task_that_never_waits_does_not_hold_commits_back(tmp_path: Path) -> None:
    state = ControllerState()
    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().snapshot_records)

    async def busy() -> None:
        while True:
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        nursery.start_soon(busy)
        for record in history(3):
            offset = append(metalog, record)
            state.replay(offset, record)
            with trio.fail_after(10):
                await metalog.wait_durable(offset)
        nursery.cancel_scope.cancel()
    assert recover(tmp_path).state == state


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    batches: list[int] = []
    state = ControllerState()
    listener = Listener(batch=lambda n, *_: batches.append(n))
    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().snapshot_records, listener=listener)
    records = history(200)
    # trio starts tasks in no fixed order; each takes the next record when it runs.
    pending = iter(records)

    async def writer() -> None:
        record = next(pending)
        offset = append(metalog, record)
        state.replay(offset, record)
        await metalog.wait_durable(offset)
        assert metalog.durable_end > offset

    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        async with trio.open_nursery() as writers:
            for _ in records:
                writers.start_soon(writer)
        nursery.cancel_scope.cancel()
    assert sum(batches) == len(records)
    assert len(batches) < len(records) / 4, batches  # group commit, not one sync each
    assert recover(tmp_path).state == state


async def test_what_gather_appends_joins_the_commit_about_to_be_made(tmp_path: Path) -> None:
    """The server's readable connections are served just before a commit (``before_commit``): the
    records their requests append are written by that commit, not by one sync later."""
    batches: list[int] = []
    state = ControllerState()
    listener = Listener(batch=lambda n, *_: batches.append(n))
    records = iter(history(5))  # seven records
    gathered: list[int] = []

    def gather() -> None:  # as if a request had come meanwhile: two more records
        for record in itertools.islice(records, 2):
            offset = append(metalog, record)
            state.replay(offset, record)
            gathered.append(offset)

    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        listener=listener,
        before_commit=gather,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for _ in range(3):
            record = next(records)
            offset = append(metalog, record)
            state.replay(offset, record)
            await metalog.wait_durable(offset)
        nursery.cancel_scope.cancel()
    assert gathered == [1, 2, 4, 5]  # (the third commit's gather found none left)
    assert batches == [3, 3, 1]
    assert recover(tmp_path).state == state


async def test_snapshot_removes_covered_segments_and_recovery_uses_it(tmp_path: Path) -> None:
    written = await run_log(tmp_path, history(100), snapshot_interval_records=25)
    names = sorted(p.name for p in tmp_path.iterdir())
    snapshots = [n for n in names if n.endswith(".snapshot")]
    assert len(snapshots) == 1
    snapshot_offset = int(snapshots[0].split(".")[0])
    assert all(int(n.split(".")[0]) >= snapshot_offset for n in names if n.endswith(".log"))
    recovery = recover(tmp_path)
    assert recovery.state == written
    assert recovery.snapshot_offset == snapshot_offset
    assert recovery.records_replayed == written.next_offset - snapshot_offset


@pytest.mark.parametrize(("min_interval_s", "expected"), [(0.0, 3), (3600.0, 1)])
async def test_snapshots_are_spaced_by_the_minimum_interval_however_fast_records_come(
    tmp_path: Path, min_interval_s: float, expected: int
) -> None:
    """``snapshot_min_interval_ms``: 100 records in ten commits, a snapshot due every 25 of
    them, written as often as that with no minimum (at 30, 60 and 90), once in an hour's
    minimum (the first does not wait); start-up then replays what the one snapshot does not
    hold."""
    state = ControllerState()
    sizes: list[int] = []
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        snapshot_interval_records=25,
        snapshot_min_interval_s=min_interval_s,
        listener=Listener(snapshot=sizes.append),
    )
    records = history(98)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for start in range(0, len(records), 10):
            for record in records[start : start + 10]:
                state.replay(append(metalog, record), record)
            await metalog.flush()
            with trio.fail_after(30):  # (a snapshot due is written before the next one)
                while metalog.snapshots.running:
                    await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert len(sizes) == expected
    recovery = recover(tmp_path)
    assert recovery.state == state
    assert recovery.records_replayed == 100 - recovery.snapshot_offset


async def test_retention_keeps_covered_segments_for_the_audit_trail(tmp_path: Path) -> None:
    await run_log(tmp_path, history(100), snapshot_interval_records=25, retention_bytes=10**9)
    contents = read_log(tmp_path)
    assert contents.entries()[0].offset == 0  # the whole history is still there
    assert contents.snapshot_offset > 0


async def test_start_up_reads_no_segment_a_snapshot_covers(tmp_path: Path) -> None:
    """The audit trail's segments (wholly below the snapshot) are not read at start-up, so
    their size (up to log_retention_bytes) never slows it; `log verify` reads them."""
    state = await run_log(
        tmp_path, history(100), snapshot_interval_records=25, retention_bytes=10**9
    )
    oldest = sorted(tmp_path.glob("*.log"))[0]
    data = bytearray(oldest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damage inside the oldest, covered segment
    oldest.write_bytes(bytes(data))
    recovery = recover(tmp_path)
    assert recovery.state == state and recovery.snapshot_offset > offset_of(oldest)
    assert recovery.records_replayed == state.next_offset - recovery.snapshot_offset
    with pytest.raises(LogCorruption, match=oldest.name):
        read_log(tmp_path)


async def write_and_snapshot(
    metalog: MetadataLog, state: ControllerState, batch: list[Record]
) -> None:
    """Append ``batch`` as one commit and wait for the snapshot it makes due."""
    for record in batch:
        state.replay(append(metalog, record), record)
    await metalog.flush()
    with trio.fail_after(60):
        while metalog.snapshot_offset < state.next_offset:
            await trio.sleep(0.01)


class TrailWatch(CommitListener):
    """What the log says of its audit trail after each snapshot."""

    def __init__(self) -> None:
        self.floors: list[tuple[int, int]] = []

    def audit_trail_kept(self, floor_bytes: int, retention_bytes: int) -> None:
        self.floors.append((floor_bytes, retention_bytes))


def retaining_log(
    data_dir: Path,
    state: ControllerState,
    retention_ms: int,
    retention_bytes: int = 10**9,
    listener: CommitListener | None = None,
) -> MetadataLog:
    return MetadataLog(
        data_dir,
        0,
        0,
        lambda: state.copy().snapshot_records,
        snapshot_interval_records=25,
        retention_bytes=retention_bytes,
        retention_ms=retention_ms,
        listener=listener,
    )


def age(path: Path, days: float) -> None:
    then = time.time() - days * 86_400
    os.utime(path, (then, then))


async def test_retention_time_is_a_floor_that_no_byte_limit_cuts_into(tmp_path: Path) -> None:
    """A covered segment younger than log_retention_ms is kept whatever the bytes (a burst
    of large records cannot flush the audit trail), and said to be above the byte limit;
    once older it goes, the oldest first, and the log stays whole."""
    records, state, watch = history(60), ControllerState(), TrailWatch()
    metalog = retaining_log(tmp_path, state, 86_400_000, retention_bytes=0, listener=watch)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write_and_snapshot(metalog, state, records[:32])  # segment 0 covered, kept
        assert sorted(p.name for p in tmp_path.glob("*.log")) == [
            segment_name(0),
            segment_name(32),
        ]
        floor = (tmp_path / segment_name(0)).stat().st_size
        assert watch.floors == [(floor, 0)]
        age(tmp_path / segment_name(0), 8)
        # A snapshot at 62: segment 0 is past the floor and over the bytes: it goes; 32 is
        # within the floor and stays.
        await write_and_snapshot(metalog, state, records[32:])
        nursery.cancel_scope.cancel()
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [segment_name(32), segment_name(62)]
    assert watch.floors[-1] == ((tmp_path / segment_name(32)).stat().st_size, 0)
    assert read_log(tmp_path).entries()[0].offset == 32
    assert recover(tmp_path).state == state


async def test_retention_keeps_segments_past_the_floor_within_the_bytes(tmp_path: Path) -> None:
    records, state = history(60), ControllerState()
    first_size = 0
    metalog = retaining_log(tmp_path, state, 86_400_000, retention_bytes=10**9)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write_and_snapshot(metalog, state, records[:32])
        first_size = (tmp_path / segment_name(0)).stat().st_size
        age(tmp_path / segment_name(0), 30)
        await write_and_snapshot(metalog, state, records[32:])
        nursery.cancel_scope.cancel()
    names = sorted(p.name for p in tmp_path.glob("*.log"))
    assert names == [segment_name(0), segment_name(32), segment_name(62)]
    assert first_size > 0


async def test_retention_of_zero_time_and_bytes_deletes_covered_segments_at_once(
    tmp_path: Path,
) -> None:
    records, state = history(60), ControllerState()
    metalog = retaining_log(tmp_path, state, retention_ms=0, retention_bytes=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write_and_snapshot(metalog, state, records[:32])
        await write_and_snapshot(metalog, state, records[32:])
        nursery.cancel_scope.cancel()
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [segment_name(62)]


# -- the reservation file ------------------------------------------------------------------


def reserving_history() -> list[Record]:
    return [
        ClusterCreated("c", 1),
        BrokerRegistered(1, "inc", 1),
        ProducerIdsReserved(3000),
        grant(0),
        grant(1),
        ProducerIdsReserved(6000),
        grant(2),
    ]


async def test_a_reservation_is_in_its_file_before_the_grants_it_covers(tmp_path: Path) -> None:
    seen: list[tuple[int | None, int]] = []
    state = ControllerState()

    def committed(durable_end: int) -> None:
        seen.append((read_reservation(tmp_path), durable_end))

    listener = Listener(committed=committed)
    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().snapshot_records, listener=listener)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in reserving_history():
            state.replay(append(metalog, record), record)
            await metalog.flush()  # one commit each
        release = ProducerIdsReserved(3000)  # a clean stop lowers it to the mark
        state.replay(append(metalog, release), release)
        await metalog.flush()
        nursery.cancel_scope.cancel()
    # Each commit: the file already held the reservation its records needed.
    assert seen[:7] == [
        (None, 1),
        (None, 2),
        (3000, 3),
        (3000, 4),
        (3000, 5),
        (6000, 6),
        (6000, 7),
    ]
    assert read_reservation(tmp_path) == 3000  # lowered after the release was durable
    assert recover(tmp_path).reservation == 3000


async def test_records_appended_while_a_reservation_is_written_wait_for_theirs(
    tmp_path: Path,
) -> None:
    """Commits in the log's thread: while the file takes one reservation, grants keep
    coming with the reservations past it that they need. None of them may be written
    before the file holds theirs (a batch took them all after one reservation, on a busy
    machine: the file 4,635, the log's grants up to 4,829)."""
    ends: dict[int, int] = {}  # a grant's offset: where its block ends
    broken: list[tuple[int | None, int]] = []

    def committed(durable_end: int) -> None:
        needed = max((end for offset, end in ends.items() if offset < durable_end), default=0)
        reserved = read_reservation(tmp_path)
        if needed > (reserved or 0):
            broken.append((reserved, needed))

    state = ControllerState()
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        inline_sync_max_s=0,  # every commit and reservation in the thread
        listener=Listener(committed=committed),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in history(0):
            state.replay(append(metalog, record), record)
        for n in range(300):
            reserve, block = ProducerIdsReserved((n + 1) * 1000), grant(n)
            state.replay(append(metalog, reserve), reserve)
            state.replay(offset := append(metalog, block), block)
            ends[offset] = block.next_producer_id
            await trio.sleep(0)  # the writer runs on, the next pair comes meanwhile
        await metalog.flush()
        nursery.cancel_scope.cancel()
    assert broken == []
    assert read_reservation(tmp_path) == 300_000


async def test_a_snapshot_waits_until_the_log_has_grown_by_the_last_ones_size(
    tmp_path: Path,
) -> None:
    """Past ``snapshot_interval_records``, the next snapshot still waits for as many bytes
    of records as the last snapshot holds: a large state is not copied and written every few
    records (a mass expiry made 30 snapshots in 4 s). The first snapshot, with none before
    it, comes at the interval; so does each one while the state stays small. A restarted
    log counts the bytes since the snapshot on disk."""
    state = ControllerState()
    sizes: list[int] = []
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        snapshot_interval_records=10,
        listener=Listener(snapshot=sizes.append),
    )
    ids = [
        TransactionalIdUpdated(f"transactional-id-{n:05}", n, 0, -1, -1, 60_000, 1)
        for n in range(2_000)
    ]

    async def write(records: list[Record]) -> int:
        """Append and commit ``records``; the bytes they take in the log."""
        written = 0
        for record in records:
            entry = encode_entry(metalog.end_offset, 0, record)
            written += len(entry)
            state.replay(metalog.append_entry(entry), record)
        await metalog.flush()
        return written

    grants = itertools.count(2)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write([*history(2), *ids])  # grants for the ids' producer ids, then the ids
        with trio.fail_after(30):  # the first snapshot: none before it
            while not sizes:
                await trio.sleep(0.01)
        first = metalog.snapshot_offset
        grown = 0
        while True:
            grown += await write([grant(next(grants)) for _ in range(10)])
            if grown >= sizes[0]:
                break
            # Many times the interval past the snapshot, but fewer bytes than it holds.
            assert metalog.snapshot_offset == first, (grown, sizes)
        with trio.fail_after(30):  # the log has grown by the snapshot's size
            while metalog.snapshot_offset == first:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert sizes[0] > 2_000 * 20 and len(sizes) == 2
    assert recover(tmp_path).state == state
    # Restarted: the snapshot on disk is the one to grow past.
    again = MetadataLog(
        tmp_path, state.next_offset, metalog.snapshot_offset, lambda: state.copy().snapshot_records
    )
    assert again.snapshot_size == sizes[1]


# -- preallocation: zeros ahead of the records ---------------------------------------------

CHUNK = 64 * 1024


def _records_end(path: Path) -> int:
    """Where a segment's records end (its zeros after them are not records)."""
    scan = scan_segment(path.read_bytes(), offset_of(path))
    assert scan.problem is None
    return scan.valid_bytes


async def test_records_go_before_the_zeros_preallocated_for_them_and_a_clean_close_gives_them_back(
    tmp_path: Path,
) -> None:
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path, 0, 0, lambda: state.copy().snapshot_records, preallocate_bytes=2 * CHUNK
    )
    segment = tmp_path / segment_name(0)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in history(50):
            state.replay(append(metalog, record), record)
            await metalog.flush()
        # The zeros come in a worker thread after a commit: at least one chunk ahead.
        await until(lambda: segment.stat().st_size >= _records_end(segment) + CHUNK)
        live = read_log(tmp_path)  # a reader while the server runs stops at the zeros
        assert live.torn_tail_bytes == 0 and live.end_offset == 52
        nursery.cancel_scope.cancel()
    assert segment.stat().st_size == _records_end(segment)  # given back by the clean close
    assert recover(tmp_path).state == state


async def test_a_batch_larger_than_the_zeros_ahead_is_written_whole(tmp_path: Path) -> None:
    """Batches of 64 KiB and more while zeros of one chunk at a time are written after
    them: a commit that would reach past the zeros waits for the chunk being written, so
    the zeros never land on records."""
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path, 0, 0, lambda: state.copy().snapshot_records, preallocate_bytes=CHUNK
    )
    ids = (f"tx-{i:05d}-" + "x" * 200 for i in itertools.count())
    written: list[Record] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for _ in range(20):
            for _ in range(300):  # about 80 kB in one batch
                written.append(TransactionalIdUpdated(next(ids), 7, 0, -1, -1, 60_000, 0))
                append(metalog, written[-1])
            await metalog.flush()
        nursery.cancel_scope.cancel()
    contents = read_log(tmp_path)
    assert contents.torn_tail_bytes == 0
    assert [e.record for e in contents.entries()] == written


async def test_zeros_stop_where_the_segment_rolls_and_a_roll_gives_them_back(
    tmp_path: Path,
) -> None:
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path,
        0,
        0,
        lambda: state.copy().snapshot_records,
        segment_max_bytes=3 * CHUNK,
        preallocate_bytes=8 * CHUNK,
    )
    first = tmp_path / segment_name(0)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        record = history(1)[0]
        state.replay(append(metalog, record), record)
        await metalog.flush()
        await until(lambda: first.stat().st_size > _records_end(first))
        assert first.stat().st_size <= 3 * CHUNK  # not the 8 chunks asked for
        grants = itertools.count()
        while len(list(tmp_path.glob("*.log"))) < 2:
            record = grant(next(grants))
            state.replay(append(metalog, record), record)
            await metalog.flush()
        assert first.stat().st_size == _records_end(first)
        nursery.cancel_scope.cancel()
    assert recover(tmp_path).state == state


async def test_a_commit_writes_at_most_max_commit_bytes(tmp_path: Path) -> None:
    """Records appended together past MAX_COMMIT_BYTES are committed in several writes,
    each within it (one record fits alone): recovery looks no further for what a power cut
    left of one commit."""
    sizes: list[int] = []

    class Sizes(CommitListener):
        def batch_written(self, records: int, size: int, seconds: float, in_thread: bool) -> None:
            sizes.append(size)

    state = ControllerState()
    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().snapshot_records, listener=Sizes())
    written = [
        TransactionalIdUpdated(f"{i}-" + "x" * 400_000, 7, 0, -1, -1, 60_000, 0) for i in range(6)
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        for record in written:
            append(metalog, record)
        await metalog.flush()
        nursery.cancel_scope.cancel()
    assert len(sizes) >= 3 and max(sizes) <= MAX_COMMIT_BYTES, sizes
    assert [e.record for e in read_log(tmp_path).entries()] == written
