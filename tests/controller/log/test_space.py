"""The data dir's free space against ``data_dir_min_free_bytes``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidctl.controller.log.space import NotEnoughSpace, SpaceVerdict, check_room, free_bytes


def test_free_bytes_is_what_an_unprivileged_writer_has(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    # The file system is shared: other writers move it between the two calls.
    assert abs(free_bytes(tmp_path) - st.f_bavail * st.f_frsize) < 256 * 1024 * 1024
    assert free_bytes(tmp_path) <= st.f_bfree * st.f_frsize  # root's reserve not counted


def test_a_verdict_names_the_shortfall_and_what_to_do() -> None:
    assert SpaceVerdict(free=2_000_000, minimum=2_000_000).problem is None
    assert SpaceVerdict(free=0, minimum=0).problem is None  # 0: not checked
    problem = SpaceVerdict(free=1_048_576, minimum=67_108_864).problem
    assert problem is not None
    assert problem.startswith("1.0 MiB (1048576 bytes) free on the data dir's filesystem")
    assert "below data_dir_min_free_bytes (64.0 MiB (67108864 bytes))" in problem
    assert "log_retention_bytes" in problem


def test_check_room_refuses_naming_the_data_dir(tmp_path: Path) -> None:
    assert check_room(tmp_path, 0) >= 0
    with pytest.raises(NotEnoughSpace, match=f"data dir {tmp_path}: .*; not starting"):
        check_room(tmp_path, 2**62)
