from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import structlog
import trio

from pidctl.controller.core.logformat import encode_entry, scan_segment
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    ProducerIdsGranted,
    Record,
)
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import (
    DataDirLocked,
    LogCorruption,
    MetadataLog,
    lock_data_dir,
    read_log,
    recover,
    segment_name,
    write_snapshot_file,
)


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
            state.replay(metalog.append(record, 0), record)
        await metalog.flush()
        nursery.cancel_scope.cancel()
    return state


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    batches: list[int] = []
    state = ControllerState()
    metalog = MetadataLog(
        tmp_path, 0, 0, lambda: state.copy().to_snapshot, on_batch=lambda n, _: batches.append(n)
    )
    records = history(200)
    # trio starts tasks in no fixed order; each takes the next record when it runs.
    pending = iter(records)

    async def writer() -> None:
        record = next(pending)
        offset = metalog.append(record, 0)
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
