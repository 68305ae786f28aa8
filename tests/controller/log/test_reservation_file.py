"""The reservation file: a higher value asked for is on disk before the commit goes on,
a lower one is written after it; each through the descriptor opened ahead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidctl.controller.log.datadir import StorageFailed, read_reservation
from pidctl.controller.log.disk_thread import DiskThread
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.reservation_file import ReservationFile
from pidctl.controller.log.sync_place import SyncPlace


@pytest.mark.parametrize("max_s", [0.0, 1.0])  # in the log's thread, on the loop
async def test_a_raise_is_written_before_and_a_lowering_after(tmp_path: Path, max_s: float) -> None:
    told: list[StorageFailed] = []
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    reservations = ReservationFile(tmp_path, dir_fd, None, FailStop(told.append))
    disk = DiskThread("test-reservation")
    try:
        sync_place = SyncPlace(max_s)
        await reservations.raise_to_wanted(disk, sync_place)  # nothing asked: nothing written
        assert read_reservation(tmp_path) is None and reservations.reserved is None
        reservations.ask(5000)
        assert not reservations.lowered()  # (a raise is not a lowering)
        assert read_reservation(tmp_path) is None
        await reservations.raise_to_wanted(disk, sync_place)
        assert read_reservation(tmp_path) == reservations.reserved == 5000
        reservations.ask(3000)
        await reservations.raise_to_wanted(disk, sync_place)  # (lower: not before)
        assert read_reservation(tmp_path) == 5000
        assert reservations.lowered()
        await reservations.lower(disk)
        assert read_reservation(tmp_path) == reservations.reserved == 3000
        assert told == []
    finally:
        disk.close()
        reservations.close()
        os.close(dir_fd)
