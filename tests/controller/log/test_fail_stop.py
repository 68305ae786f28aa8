"""One failure, one exit status: the log's first storage failure is told once and raised;
a later one is only logged."""

from __future__ import annotations

from pathlib import Path

from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.fail_stop import FailStop


def test_only_the_first_failure_is_told_and_raised(tmp_path: Path) -> None:
    told: list[StorageFailed] = []
    fail_stop = FailStop(told.append)
    first = StorageFailed(tmp_path / "0.log", "fdatasync", OSError(5, "EIO"))
    later = StorageFailed(tmp_path / "0.snapshot", "write", OSError(28, "ENOSPC"))
    assert fail_stop.failed is None
    assert fail_stop.first(first)
    assert not fail_stop.first(later)
    assert fail_stop.failed is first and told == [first]
