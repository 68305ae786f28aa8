from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
import structlog
import trio

from pidctl.controller.core.logformat import encode_entry, offset_of, scan_segment
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    ProducerIdsGranted,
    ProducerIdsReserved,
    Record,
    TransactionalIdUpdated,
)
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import (
    BACK_OFF_WINDOW,
    QUICK_SYNCS_BEFORE_THE_LOOP,
    RESERVATION_FILE,
    DataDirLocked,
    LogCorruption,
    MetadataLog,
    SyncPlace,
    lock_data_dir,
    read_log,
    read_reservation,
    recover,
    reserve_by_operator,
    segment_name,
    snapshot_name,
    write_snapshot_file,
)


def append(metalog: MetadataLog, record: Record) -> int:
    """Buffer one record as :meth:`Controller.apply` does (encoded for the next offset)."""
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
) -> ControllerState:
    """Write records through the real MetadataLog, as the server does."""
    state = ControllerState()
    metalog = MetadataLog(
        data_dir,
        0,
        0,
        lambda: state.copy().to_snapshot,
        snapshot_interval_records=snapshot_interval_records,
        retention_bytes=retention_bytes,
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
        lambda: state.copy().to_snapshot,
        inline_sync_max_s=inline_sync_max_s,
        on_batch=lambda _records, _seconds, thread: where.append(thread),
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


async def test_a_task_that_never_waits_does_not_hold_commits_back(tmp_path: Path) -> None:
    state = ControllerState()
    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().to_snapshot)

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


def test_a_slow_sync_sends_commits_to_the_thread_until_enough_quick_ones_in_a_row() -> None:
    place = SyncPlace(0.010)
    assert not place.in_thread
    place.after(0.001)
    assert not place.in_thread
    place.after(0.010)  # slow: the next in the thread
    assert place.in_thread
    for _ in range(QUICK_SYNCS_BEFORE_THE_LOOP - 1):
        place.after(0.001)
    place.after(0.050)  # slow again before enough quick ones: the count starts over
    for _ in range(QUICK_SYNCS_BEFORE_THE_LOOP - 1):
        place.after(0.001)
        assert place.in_thread
    place.after(0.001)
    assert not place.in_thread


def test_a_disk_slow_every_65th_sync_holds_the_loop_up_twice_then_never() -> None:
    """Without backing off, commits would come back to the loop after 64 quick syncs and
    meet the next slow one there: once per 130 commits for ever."""
    place = SyncPlace(0.010)
    slow_on_loop = 0
    for sync in range(10_000):
        slow = sync % 65 == 0
        slow_on_loop += slow and not place.in_thread
        place.after(0.050 if slow else 0.001)
    assert slow_on_loop == 2
    assert place.in_thread and place.quick_needed == 2 * QUICK_SYNCS_BEFORE_THE_LOOP


def test_back_off_grows_with_each_early_slow_sync_and_shrinks_after_a_quick_spell() -> None:
    place = SyncPlace(0.010)
    for expected in (64, 128, 256):
        place.after(0.050)  # slow on the loop
        assert place.in_thread and place.quick_needed == expected
        for _ in range(expected):
            place.after(0.001)
        assert not place.in_thread  # back after that many quick ones in a row
    for _ in range(BACK_OFF_WINDOW * 256):  # a long quick spell on the loop
        place.after(0.001)
    assert not place.in_thread and place.quick_needed == 128
    place.after(0.050)  # slow, but not soon after coming back: no further back-off
    assert place.in_thread and place.quick_needed == 128


def test_no_inline_bound_keeps_every_commit_in_the_thread() -> None:
    place = SyncPlace(0.0)
    for took in (0.0, 0.001, 1.0):
        assert place.in_thread
        place.after(took)
    assert place.in_thread


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    batches: list[int] = []
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path, 0, 0, lambda: state.copy().to_snapshot, on_batch=lambda n, *_: batches.append(n)
    )
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


def retaining_log(data_dir: Path, state: ControllerState, retention_ms: int) -> MetadataLog:
    return MetadataLog(
        data_dir,
        0,
        0,
        lambda: state.copy().to_snapshot,
        snapshot_interval_records=25,
        retention_bytes=10**9,
        retention_ms=retention_ms,
    )


async def test_retention_by_time_removes_covered_segments_past_it(tmp_path: Path) -> None:
    """Within log_retention_bytes, a covered segment is kept only while its last write is
    younger than log_retention_ms; the oldest go first and the log stays whole."""
    records, state = history(60), ControllerState()
    metalog = retaining_log(tmp_path, state, retention_ms=86_400_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write_and_snapshot(metalog, state, records[:32])  # segment 0 covered, kept
        assert sorted(p.name for p in tmp_path.glob("*.log")) == [
            segment_name(0),
            segment_name(32),
        ]
        eight_days_ago = time.time() - 8 * 86_400
        os.utime(tmp_path / segment_name(0), (eight_days_ago, eight_days_ago))
        # A snapshot at 62: segment 0 is past a day and goes, 32 is not and stays.
        await write_and_snapshot(metalog, state, records[32:])
        nursery.cancel_scope.cancel()
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [segment_name(32), segment_name(62)]
    assert read_log(tmp_path).entries()[0].offset == 32
    assert recover(tmp_path).state == state


async def test_retention_of_zero_time_deletes_covered_segments_at_once(tmp_path: Path) -> None:
    records, state = history(60), ControllerState()
    metalog = retaining_log(tmp_path, state, retention_ms=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        await write_and_snapshot(metalog, state, records[:32])
        await write_and_snapshot(metalog, state, records[32:])
        nursery.cancel_scope.cancel()
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [segment_name(62)]


def test_torn_tail_is_truncated_with_a_warning(tmp_path: Path) -> None:
    path = write_segment(tmp_path, history(5))
    full = path.read_bytes()
    path.write_bytes(full[:-7])  # the last record lost its last 7 bytes
    with structlog.testing.capture_logs() as logs:
        recovery = recover(tmp_path)
    assert [e["event"] for e in logs] == ["truncating torn tail"]
    assert recovery.truncated_bytes > 0
    assert recovery.state.next_producer_id == 4000  # grants 0..3 survive, 4 was torn
    assert scan_segment(path.read_bytes(), 0).problem is None


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    path = write_segment(tmp_path, history(3))
    path.write_bytes(path.read_bytes() + b"\0" * 4096)
    recovery = recover(tmp_path)
    assert recovery.truncated_bytes == 4096
    assert recovery.state.next_producer_id == 3000


def test_corruption_in_the_middle_stops_and_touches_nothing(tmp_path: Path) -> None:
    path = write_segment(tmp_path, history(10))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    before = digest(tmp_path)
    with pytest.raises(LogCorruption) as info:
        recover(tmp_path)
    assert path.name in str(info.value)
    assert digest(tmp_path) == before


def test_flipped_length_of_a_middle_record_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    path = write_segment(tmp_path, history(10))
    data = bytearray(path.read_bytes())
    data[0] = 0x00
    data[1] = 0x0F  # first record now claims ~1 MB: it "extends past the end"
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorruption):
        recover(tmp_path)


def test_corruption_in_an_older_segment_is_never_truncated(tmp_path: Path) -> None:
    records = history(10)
    first = write_segment(tmp_path, records[:6])
    write_segment(tmp_path, records[6:], base=6)
    first.write_bytes(first.read_bytes()[:-3])
    with pytest.raises(LogCorruption):
        recover(tmp_path)


def test_missing_segment_is_corruption(tmp_path: Path) -> None:
    records = history(10)
    write_segment(tmp_path, records[:4])
    write_segment(tmp_path, records[6:], base=6)
    with pytest.raises(LogCorruption, match="missing"):
        recover(tmp_path)


def test_corrupt_snapshot_stops_start_up(tmp_path: Path) -> None:
    state = ControllerState()
    for offset, record in enumerate(history(3)):
        state.replay(offset, record)
    write_segment(tmp_path, [], base=state.next_offset)
    snapshot = write_snapshot_file(tmp_path, state.next_offset, state.to_snapshot())
    assert recover(tmp_path).state == state
    data = bytearray(snapshot.read_bytes())
    data[-2] ^= 1
    snapshot.write_bytes(bytes(data))
    with pytest.raises(LogCorruption, match="snapshot"):
        recover(tmp_path)


def test_decreasing_grant_is_corruption_not_skipped(tmp_path: Path) -> None:
    records = [*history(3), grant(1)]  # grant 1 again: a repeat of the high-water mark
    write_segment(tmp_path, records)
    with pytest.raises(LogCorruption, match="high-water"):
        recover(tmp_path)


def test_one_server_per_data_dir(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    try:
        with pytest.raises(DataDirLocked, match="in use"):
            lock_data_dir(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_data_dir(tmp_path))  # free again once released


def transactional_state(ids: list[str]) -> ControllerState:
    """A state holding ``ids``, built by replaying the records InitProducerId writes."""
    state = ControllerState()
    records: list[Record] = [
        ClusterCreated("c", 1),
        ProducerIdsGranted(1, -1, 0, len(ids), holder="controller"),
        *(TransactionalIdUpdated(tid, i, 0, i, -1, 60_000, 1000 + i) for i, tid in enumerate(ids)),
    ]
    for offset, record in enumerate(records):
        state.replay(offset, record)
    return state


ODD_IDS = ["app-1", "ünïcode-✓", "lone-\udcff-surrogate", "x" * 32767, 'with,"quote" and \\']


def test_snapshot_stores_transactional_ids_packed_and_restores_them(tmp_path: Path) -> None:
    state = transactional_state([*ODD_IDS, *(f"app-{i:08d}" for i in range(1000))])
    write_segment(tmp_path, [], base=state.next_offset)
    snapshot = write_snapshot_file(tmp_path, state.next_offset, state.to_snapshot())
    data = snapshot.read_bytes()
    assert data.startswith(b"PIDSNAP2")
    assert data.count(b"app-00000999") == 1  # a raw section, not a JSON list per id
    assert b'"app-' not in data
    recovery = recover(tmp_path)
    assert recovery.state == state
    assert recovery.records_replayed == 0
    assert recovery.state.transactions.transactional_ids["lone-\udcff-surrogate"].producer_id == 2


def test_snapshot_in_the_first_format_still_loads(tmp_path: Path) -> None:
    """A PIDSNAP1 snapshot (all JSON, transactional ids as lists) from an older pidctl."""
    state = transactional_state(ODD_IDS)
    fields = {k: v for k, v in state.to_snapshot().items() if not isinstance(v, bytearray)}
    del fields["transactional_id_count"]
    fields["transactional_ids"] = [
        [tid, *dataclasses.astuple(t)] for tid, t in state.transactions.transactional_ids.items()
    ]
    body = json.dumps({"offset": state.next_offset, "state": fields}).encode()
    header = struct.pack(">8sIQ", b"PIDSNAP1", zlib.crc32(body), len(body))
    write_segment(tmp_path, [], base=state.next_offset)
    (tmp_path / snapshot_name(state.next_offset)).write_bytes(header + body)
    assert recover(tmp_path).state == state
    assert read_log(tmp_path).snapshot_state is not None  # the tools read it too


def test_packed_ids_that_do_not_add_up_are_corruption(tmp_path: Path) -> None:
    state = transactional_state(["a", "b", "c"])
    fields = state.to_snapshot()
    fields["transactional_id_count"] = 4  # one id missing from the packed section
    write_segment(tmp_path, [], base=state.next_offset)
    write_snapshot_file(tmp_path, state.next_offset, fields)
    with pytest.raises(LogCorruption, match=r"bad snapshot state.*3 distinct, expected 4"):
        recover(tmp_path)


def test_truncated_packed_ids_are_corruption(tmp_path: Path) -> None:
    state = transactional_state(["a", "b", "c"])
    fields = state.to_snapshot()
    fields["transactional_ids_packed"] = fields["transactional_ids_packed"][:-1]
    write_segment(tmp_path, [], base=state.next_offset)
    write_snapshot_file(tmp_path, state.next_offset, fields)
    with pytest.raises(LogCorruption, match="truncated"):
        recover(tmp_path)


def recovery_memory(data_dir: Path) -> tuple[int, int]:
    """(bytes Python holds after recovering ``data_dir``, most it held meanwhile)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        recovery = recover(data_dir)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert recovery.state.transactions.transactional_ids
    return current - base, peak - base


@pytest.mark.parametrize("snapshot", [False, True])
def test_recovery_holds_the_state_not_the_history(tmp_path: Path, snapshot: bool) -> None:
    """Recovery replays each record as it reads it, and loads a snapshot's transactional
    ids without an object per id on the way: the most it holds is close to what it keeps.
    (Reading the whole log first peaked at 3.9x, a JSON snapshot at 3x.)"""
    ids = [f"app-{i:08d}" for i in range(20_000)]
    state = transactional_state(ids)
    records: list[Record] = [
        ClusterCreated("c", 1),
        ProducerIdsGranted(1, -1, 0, len(ids), holder="controller"),
        *(TransactionalIdUpdated(tid, i, 0, i, -1, 60_000, 1000 + i) for i, tid in enumerate(ids)),
    ]
    if snapshot:
        write_segment(tmp_path, [], base=state.next_offset)
        write_snapshot_file(tmp_path, state.next_offset, state.to_snapshot())
    else:
        write_segment(tmp_path, records)
    del records, state
    kept, peak = recovery_memory(tmp_path)
    assert kept < 200 * len(ids)
    assert peak < 1.3 * kept


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

    metalog = MetadataLog(tmp_path, 0, 0, lambda: state.copy().to_snapshot, on_durable=committed)
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


def test_a_damaged_missing_or_stale_reservation_file_stops_start_up(tmp_path: Path) -> None:
    write_segment(tmp_path, reserving_history())
    with pytest.raises(LogCorruption, match="missing, but the log reserved producer ids up"):
        recover(tmp_path)
    reservation = tmp_path / RESERVATION_FILE
    reservation.write_bytes(b"PIDRSRV1" + struct.pack(">Iq", 0, 6000))  # a wrong checksum
    with pytest.raises(LogCorruption, match="reservation damaged"):
        recover(tmp_path)
    said = reserve_by_operator(tmp_path, 1000)  # never below what the log granted
    assert "reserved up to 3000 (it was damaged; the log granted up to 3000)" in said
    assert said.endswith("the next start grants from 6000")  # the log's own reservation
    assert recover(tmp_path).reservation == 3000
    reserve_by_operator(tmp_path, 8000)
    assert recover(tmp_path).state.producer_ids.resume(8000).response == 8000
    packed = struct.pack(">q", 2000)
    reservation.write_bytes(b"PIDRSRV1" + struct.pack(">I", zlib.crc32(packed)) + packed)
    with pytest.raises(LogCorruption, match="below the 3000 the log granted"):
        recover(tmp_path)
