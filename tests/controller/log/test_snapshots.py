"""When a snapshot is due: records and bytes past the newest one, none being written, and
spaced by ``snapshot_min_interval_s``; once written, the listener is told and the newest
snapshot is the new one."""

from __future__ import annotations

import os
from pathlib import Path

import trio
import trio.testing

from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.metalog import CommitListener
from pidctl.controller.log.snapshots import Snapshots, SnapshotSettings


class Told(CommitListener):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def snapshot_written(self, size: int) -> None:
        self.sizes.append(size)


async def test_a_snapshot_is_due_by_records_bytes_and_time(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    failures: list[StorageFailed] = []
    told = Told()
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    try:
        settings = SnapshotSettings(10, 5.0, 1000, 1000)
        fail_stop = FailStop(failures.append)
        snapshots = Snapshots(tmp_path, dir_fd, 0, [], [], settings, told, fail_stop)
        assert not snapshots.due(9)  # too few records
        assert snapshots.due(10)
        async with trio.open_nursery() as nursery:
            snapshots.start(nursery, 10, ControllerState().copy().snapshot_records)
            snapshots.appended(10**6)  # (appended while it is written: not covered by it)
            assert snapshots.running and not snapshots.due(30)  # one at a time
        assert not snapshots.running and told.sizes == [snapshots.size] and snapshots.size > 0
        assert snapshots.offset == 10 and (tmp_path / "00000000000000000010.snapshot").exists()
        assert snapshots.bytes_since == 10**6  # what came after it
        assert not snapshots.due(19)  # too few records since the new one
        snapshots.bytes_since = snapshots.size - 1
        assert not snapshots.due(20)  # the log grew less than its size
        snapshots.appended(1)
        assert not snapshots.due(20)  # less than 5 s since the last began
        mock_clock.jump(5.0)
        assert snapshots.due(20)
        assert failures == []
    finally:
        os.close(dir_fd)
