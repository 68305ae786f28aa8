"""Reading a data dir back and start-up's recovery: torn tails, corruption, snapshots."""

from __future__ import annotations

import base64
import gc
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from pidctl.controller.core.logformat import (
    MAX_COMMIT_BYTES,
    LogCorruption,
    encode_entry,
    scan_segment,
    snapshot_name,
)
from pidctl.controller.core.records import (
    SNAPSHOT_CHUNK_BYTES,
    ClusterCreated,
    ProducerIdsGranted,
    Record,
    TransactionalIdsLoaded,
    TransactionalIdUpdated,
    TransactionsState,
)
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.datadir import (
    DAMAGED_TAIL_FILE,
    decode_snapshot,
    remove_damaged_tail_file,
    write_damaged_tail_file,
    write_snapshot_file,
)
from pidctl.controller.log.recovery import read_log, recover
from tests.controller.log.test_metalog import (
    digest,
    grant,
    history,
    write_segment,
)


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


def test_a_cut_tail_is_noted_before_the_cut_until_the_log_says_so(tmp_path: Path) -> None:
    """Start-up notes the cut (a file, synced) before it truncates: a start-up that stops
    after the cut and before the server records it (DamagedTailTruncated) leaves the note,
    and the next one reports the cut again, though its log has no torn tail left."""
    path = write_segment(tmp_path, history(5))
    path.write_bytes(path.read_bytes()[:-7])  # the last record lost its last 7 bytes
    first = recover(tmp_path)
    assert first.damaged_tail_bytes == first.truncated_bytes > 0
    assert (tmp_path / DAMAGED_TAIL_FILE).exists()
    again = recover(tmp_path)  # the first one stopped before recording it
    assert (again.truncated_bytes, again.damaged_tail_bytes) == (0, first.truncated_bytes)
    remove_damaged_tail_file(tmp_path)  # what the server does once it is recorded
    assert recover(tmp_path).damaged_tail_bytes is None
    write_damaged_tail_file(tmp_path, 7)  # an earlier note, and another cut: both counted
    path.write_bytes(path.read_bytes()[:-3])
    second = recover(tmp_path)
    assert second.damaged_tail_bytes == 7 + second.truncated_bytes


def test_a_zero_filled_tail_is_preallocated_space_given_back_without_a_warning(
    tmp_path: Path,
) -> None:
    path = write_segment(tmp_path, history(3))
    records = path.read_bytes()
    path.write_bytes(records + b"\0" * 4096)
    with structlog.testing.capture_logs() as logs:
        recovery = recover(tmp_path)
    assert logs == [] and recovery.truncated_bytes == 0
    assert recovery.state.next_producer_id == 3000
    assert path.read_bytes() == records


def test_zeros_followed_by_anything_else_are_a_torn_tail(tmp_path: Path) -> None:
    path = write_segment(tmp_path, history(3))
    path.write_bytes(path.read_bytes() + b"\0" * 4096 + b"\x01")
    with structlog.testing.capture_logs() as logs:
        recovery = recover(tmp_path)
    assert [e["event"] for e in logs] == ["truncating torn tail"]
    assert recovery.truncated_bytes == 4097
    assert recovery.state.next_producer_id == 3000


def test_zeroed_records_with_records_after_them_are_corruption_not_preallocated_space(
    tmp_path: Path,
) -> None:
    """Only zeros through to the end of the file are preallocated: a zeroed stretch with an
    intact record after it is damage to synced records, and start-up stops."""
    path = write_segment(tmp_path, history(10))
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 200 : middle] = bytes(200)
    path.write_bytes(bytes(data))
    before = digest(tmp_path)
    with pytest.raises(LogCorruption):
        recover(tmp_path)
    assert digest(tmp_path) == before


def _cut_commit(tmp_path: Path, gap_at: int = 0, gap: int = 512) -> tuple[Path, int]:
    """A segment of 5 records synced, then a commit of 40 more over preallocated zeros,
    of which a power cut left one stretch of ``gap`` bytes unwritten (zeros, 512-aligned,
    ``gap_at`` sectors into the commit's first whole sector); where the synced records end."""
    records = history(43)
    path = write_segment(tmp_path, records[:5])
    synced = path.read_bytes()
    commit = b"".join(encode_entry(5 + i, 1000, r) for i, r in enumerate(records[5:]))
    data = bytearray(synced + commit + bytes(1 << 16))
    first = -(-len(synced) // 512) * 512 + gap_at * 512
    data[first : first + gap] = bytes(gap)
    path.write_bytes(bytes(data))
    return path, len(synced)


def test_a_commit_a_power_cut_left_partly_written_is_a_torn_tail(tmp_path: Path) -> None:
    """Over preallocated zeros the disk writes a commit's sectors in no set order: a cut
    can leave one unwritten between written ones, so intact records of that commit follow
    the gap. Never acknowledged (its sync did not finish): truncated, with a warning."""
    path, synced = _cut_commit(tmp_path)
    gap = -(-synced // 512) * 512
    before_gap = scan_segment(path.read_bytes()[:gap], 0)  # the commit's records wholly before it
    with structlog.testing.capture_logs() as logs:
        recovery = recover(tmp_path)
    assert [e["event"] for e in logs] == ["truncating torn tail"]
    assert recovery.records_replayed == len(before_gap.entries) < 45
    assert path.stat().st_size == before_gap.valid_bytes


def test_intact_records_after_damage_without_an_unwritten_sector_are_corruption(
    tmp_path: Path,
) -> None:
    """The same records with a few bytes damaged instead of a sector left at zeros: no
    power cut leaves that, and start-up stops."""
    path, _ = _cut_commit(tmp_path, gap=0)
    data = bytearray(path.read_bytes())
    data[len(data) - (1 << 16) - 3000] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorruption):
        recover(tmp_path)


def test_records_beyond_one_commits_reach_after_a_gap_are_corruption(tmp_path: Path) -> None:
    """A gap of zeros followed by intact records further than one commit can reach
    (MAX_COMMIT_BYTES): no single cut write explains them."""
    records = history(8)
    path = write_segment(tmp_path, records[:5])
    later = b"".join(encode_entry(5 + i, 1000, r) for i, r in enumerate(records[5:]))
    path.write_bytes(path.read_bytes() + bytes(MAX_COMMIT_BYTES + 4096) + later + bytes(4096))
    with pytest.raises(LogCorruption):
        recover(tmp_path)


def test_an_older_record_after_a_gap_is_corruption(tmp_path: Path) -> None:
    """Intact records after the gap must come after the ones before it."""
    records = history(8)
    path = write_segment(tmp_path, records)
    data = path.read_bytes()
    stale = encode_entry(3, 1000, records[3])  # an offset already in the log
    path.write_bytes(data + bytes(1024) + stale + bytes(4096))
    with pytest.raises(LogCorruption):
        recover(tmp_path)


def test_zeros_after_an_older_segments_records_are_given_back_too(tmp_path: Path) -> None:
    """A crash after a roll can leave the zeros of the segment rolled from (its truncation
    was not synced): they end its records, as in the last segment."""
    first = write_segment(tmp_path, history(3))
    records = first.read_bytes()
    first.write_bytes(records + bytes(8192))
    second = write_segment(tmp_path, [grant(3)], base=5)
    recovery = recover(tmp_path)
    assert recovery.state.next_producer_id == 4000
    assert first.read_bytes() == records and second.stat().st_size > 0


_CUT_WHILE_READING = """
import os, sys, threading, time
from pathlib import Path
from pidctl.controller.log.recovery import read_log
segment, records_end = Path(sys.argv[1]), int(sys.argv[2])
stop = time.monotonic() + float(sys.argv[3])
def cut_and_grow():  # a server's rolls and clean stops, as fast as they can come
    fd = os.open(segment, os.O_WRONLY)
    while time.monotonic() < stop:
        os.ftruncate(fd, records_end)
        os.pwrite(fd, bytes(1 << 20), records_end)
cutter = threading.Thread(target=cut_and_grow)
cutter.start()
reads = 0
while time.monotonic() < stop:
    assert read_log(segment.parent).end_offset == 12
    reads += 1
cutter.join()
print(reads)
"""


def test_a_live_read_survives_zeros_cut_off_while_it_reads(tmp_path: Path) -> None:
    """A reader beside a running server (log verify, log dump) meets segments whose zeros
    the server cuts off at a roll or a clean stop. Mapped, a page past the file's new end
    kills the reader with SIGBUS; read, it is only a shorter copy. Two seconds of a
    segment cut and grown again under a reader in a loop, in a process of its own."""
    path = write_segment(tmp_path, history(10))
    records_end = path.stat().st_size
    path.write_bytes(path.read_bytes() + bytes(1 << 20))
    done = subprocess.run(
        [sys.executable, "-c", _CUT_WHILE_READING, str(path), str(records_end), "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert int(done.stdout) > 10  # reads, each of a segment being cut


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
    snapshot = write_snapshot_file(tmp_path, state.next_offset, state.snapshot_records())
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


def test_snapshot_restates_transactional_ids_in_chunks_and_restores_them(tmp_path: Path) -> None:
    state = transactional_state([*ODD_IDS, *(f"app-{i:08d}" for i in range(30_000))])
    write_segment(tmp_path, [], base=state.next_offset)
    snapshot = write_snapshot_file(tmp_path, state.next_offset, state.snapshot_records())
    data = snapshot.read_bytes()
    assert data.startswith(b"PIDSNAP3")
    _, entries = decode_snapshot(snapshot, data)
    loaded = [e.record for e in entries if isinstance(e.record, TransactionalIdsLoaded)]
    # The packed rows in a few records (each within SNAPSHOT_CHUNK_BYTES), not one per id.
    assert 2 <= len(loaded) <= 4
    assert sum(record.count for record in loaded) == 30_000 + len(ODD_IDS)
    assert all(len(base64.b64decode(r.rows)) <= SNAPSHOT_CHUNK_BYTES for r in loaded)
    recovery = recover(tmp_path)
    assert recovery.state == state
    assert recovery.records_replayed == 0
    assert recovery.state.transactions.transactional_ids["lone-\udcff-surrogate"].producer_id == 2
    assert read_log(tmp_path).snapshot_entries is not None  # the tools read it too


def _rewritten(
    state: ControllerState, change: Callable[[Record], Record]
) -> list[tuple[int, Record]]:
    return [(at, change(record)) for at, record in state.snapshot_records()]


def test_packed_ids_that_do_not_add_up_are_corruption(tmp_path: Path) -> None:
    state = transactional_state(["a", "b", "c"])

    def one_more(record: Record) -> Record:
        if isinstance(record, TransactionalIdsLoaded):
            return TransactionalIdsLoaded(record.count + 1, record.rows)
        return record

    write_segment(tmp_path, [], base=state.next_offset)
    write_snapshot_file(tmp_path, state.next_offset, _rewritten(state, one_more))
    with pytest.raises(LogCorruption, match=r"bad snapshot.*3 distinct, expected 4"):
        recover(tmp_path)


def test_truncated_packed_ids_are_corruption(tmp_path: Path) -> None:
    state = transactional_state(["a", "b", "c"])

    def cut(record: Record) -> Record:
        if isinstance(record, TransactionalIdsLoaded):
            rows = base64.b64decode(record.rows)[:-1]
            return TransactionalIdsLoaded(record.count, base64.b64encode(rows).decode())
        return record

    write_segment(tmp_path, [], base=state.next_offset)
    write_snapshot_file(tmp_path, state.next_offset, _rewritten(state, cut))
    with pytest.raises(LogCorruption, match="truncated"):
        recover(tmp_path)


def test_a_snapshots_record_in_the_log_is_corruption(tmp_path: Path) -> None:
    write_segment(tmp_path, [*history(2), TransactionsState(5)])
    with pytest.raises(LogCorruption, match="a snapshot's TransactionsState"):
        recover(tmp_path)


def test_a_snapshot_renamed_to_another_offset_is_corruption(tmp_path: Path) -> None:
    state = transactional_state(["a", "b"])
    write_segment(tmp_path, [*history(1)], base=0)
    snapshot = write_snapshot_file(tmp_path, state.next_offset, state.snapshot_records())
    snapshot.rename(tmp_path / snapshot_name(state.next_offset - 1))
    with pytest.raises(LogCorruption, match="stands at offset"):
        read_log(tmp_path)


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
    ids a chunk at a time, without an object per id on the way: the most it holds is close
    to what it keeps. (Reading the whole log first peaked at 3.9x, a JSON snapshot at 3x.)"""
    ids = [f"app-{i:08d}" for i in range(20_000)]
    state = transactional_state(ids)
    records: list[Record] = [
        ClusterCreated("c", 1),
        ProducerIdsGranted(1, -1, 0, len(ids), holder="controller"),
        *(TransactionalIdUpdated(tid, i, 0, i, -1, 60_000, 1000 + i) for i, tid in enumerate(ids)),
    ]
    if snapshot:
        write_segment(tmp_path, [], base=state.next_offset)
        write_snapshot_file(tmp_path, state.next_offset, state.snapshot_records())
    else:
        write_segment(tmp_path, records)
    del records, state
    kept, peak = recovery_memory(tmp_path)
    assert kept < 200 * len(ids)
    # A snapshot's record at a time: one chunk of packed rows decoded (its text, its bytes).
    assert peak < 1.3 * kept + (4 * SNAPSHOT_CHUNK_BYTES if snapshot else 0)


def test_writing_a_snapshot_holds_a_record_at_a_time(tmp_path: Path) -> None:
    """The snapshot's records go to the file one by one: writing a snapshot of many ids
    holds about one chunk's bytes, not the table's again (joined, it held the packed
    rows' size: 44 B per id)."""
    state = transactional_state([f"app-{i:08d}" for i in range(200_000)])
    packed = sum(
        len(rows) for _, rows in state.transactions.transactional_ids.packed_chunks(1 << 62)
    )
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        snapshot = write_snapshot_file(tmp_path, state.next_offset, state.snapshot_records())
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 8 * SNAPSHOT_CHUNK_BYTES < packed  # (its copies of one chunk, encoded)
    write_segment(tmp_path, [], base=state.next_offset)
    assert snapshot.stat().st_size > packed
    assert recover(tmp_path).state == state
