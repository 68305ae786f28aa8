"""The zeros ahead of the records: a chunk once less than half is left (never past where
the segment rolls), written in a worker thread unless commits stay on the loop; a clean
close gives them back."""

from __future__ import annotations

import math
import os
from pathlib import Path

import trio

from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.preallocation import MIN_PREALLOCATE_BYTES, Preallocation
from pidctl.controller.log.sync_place import SyncPlace

CHUNK = MIN_PREALLOCATE_BYTES


async def test_zeros_are_written_once_less_than_half_is_left_and_given_back(tmp_path: Path) -> None:
    failures: list[StorageFailed] = []
    segment = tmp_path / "0.log"
    segment.write_bytes(b"r" * 100)
    preallocation = Preallocation(
        100, 2 * CHUNK, 4 * CHUNK, SyncPlace(1.0), FailStop(failures.append)
    )
    async with trio.open_nursery() as nursery:
        preallocation.soon(nursery, segment, 100)  # in a worker thread
        assert preallocation.running is not None
        await preallocation.wait()
    assert preallocation.allocated == 100 + 2 * CHUNK == segment.stat().st_size
    async with trio.open_nursery() as nursery:
        preallocation.soon(nursery, segment, 100 + CHUNK)  # half is left: nothing
        assert preallocation.running is None
        # Less than half left: whole chunks up to where the segment rolls (one here).
        preallocation.soon(nursery, segment, 100 + CHUNK + 1)
        await preallocation.wait()
    assert preallocation.allocated == 100 + 3 * CHUNK
    with open(segment, "rb+") as f:
        preallocation.release(segment, f.fileno(), 100)
    assert segment.read_bytes() == b"r" * 100 and failures == []


async def test_on_the_loop_where_commits_stay_there(tmp_path: Path) -> None:
    segment = tmp_path / "0.log"
    segment.write_bytes(b"")
    preallocation = Preallocation(0, CHUNK, 10 * CHUNK, SyncPlace(math.inf), FailStop(print))
    async with trio.open_nursery() as nursery:
        preallocation.soon(nursery, segment, 0)
        assert preallocation.running is None  # written already
    assert preallocation.allocated == CHUNK == os.stat(segment).st_size
    preallocation.rolled()
    assert preallocation.allocated == 0
