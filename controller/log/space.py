"""Free space on the data dir's filesystem: checked before the server starts and while it
runs, so that a full disk is refused at start-up with a clear message, and shown by
``/readyz`` before a commit fails with ENOSPC (which stops the server, exit 74)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pidctl.controller.core.errors import PidctlError

#: Default for ``data_dir_min_free_bytes``: room for a snapshot of a large state (a million
#: transactional ids take ~40 MB) and records meanwhile; a grant record is ~100 bytes.
DEFAULT_MIN_FREE_BYTES: Final = 64 * 1024 * 1024


class NotEnoughSpace(PidctlError):
    """The data dir's filesystem has less free space than ``data_dir_min_free_bytes``."""


def free_bytes(data_dir: Path) -> int:
    """Bytes an unprivileged process may still write on the data dir's filesystem
    (``statvfs``: available blocks, not counting those reserved for root)."""
    st = os.statvfs(data_dir)
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True, slots=True)
class SpaceVerdict:
    """Free bytes against the minimum: ``problem`` is None while there is room (always,
    with a minimum of 0)."""

    free: int
    minimum: int

    @property
    def problem(self) -> str | None:
        if self.free >= self.minimum:
            return None
        return (
            f"{_mib(self.free)} free on the data dir's filesystem, below "
            f"data_dir_min_free_bytes ({_mib(self.minimum)}): make room there (a smaller "
            "log_retention_ms and log_retention_bytes keep less of the audit trail), or lower the "
            "setting"
        )


def check_room(data_dir: Path, minimum: int) -> int:
    """Start-up: the free bytes, or :class:`NotEnoughSpace` naming the data dir."""
    verdict = SpaceVerdict(free_bytes(data_dir), minimum)
    if verdict.problem is not None:
        raise NotEnoughSpace(f"data dir {data_dir}: {verdict.problem}; not starting")
    return verdict.free


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB ({size} bytes)"
