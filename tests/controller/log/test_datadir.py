"""The data dir's lock (its file formats are exercised through the log and recovery)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidctl.controller.log.datadir import (
    DataDirLocked,
    lock_data_dir,
)


def test_one_server_per_data_dir(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    try:
        with pytest.raises(DataDirLocked, match="in use"):
            lock_data_dir(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_data_dir(tmp_path))  # free again once released
