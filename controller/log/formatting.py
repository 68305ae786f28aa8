"""Creating a data dir (``pidctl format``), and telling a formatted one from anything else.

A data dir is *formatted* once it holds a metadata log: its first segment, whose first record
is :class:`ClusterCreated`. ``pidctl serve`` starts only on a formatted data dir, as Kafka
starts only on a formatted log dir (``kafka-storage.sh format``): a wrong working directory,
a typo or a volume not mounted then stops start-up, instead of creating a new cluster that
grants producer ids from the start of the range again (idempotent producers do not check
cluster ids).

Formatting is atomic: the first segment is written as a temporary file, synced, renamed into
place and the directory synced, so a data dir either holds a whole first record or no log at
all (an interrupted format leaves only files :func:`format_data_dir` accepts again).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.logformat import (
    MAX_RECORD_BYTES,
    SEGMENT_SUFFIX,
    SNAPSHOT_SUFFIX,
    TMP_SUFFIX,
    encode_entry,
    scan_segment,
    segment_name,
    snapshot_name,
)
from pidctl.controller.core.records import ClusterCreated
from pidctl.controller.log.datadir import LOCK_FILE, fsync_dir, lock_data_dir
from pidctl.controller.log.recovery import read_log, rebuild_state

#: What a directory may hold and still be formatted: ext4's ``lost+found`` (a new volume
#: has one) and what an interrupted format leaves (the lock file, a temporary segment).
_IGNORED_NAMES: Final = frozenset({"lost+found", LOCK_FILE})


class NotFormatted(PidctlError):
    """``pidctl serve`` on a data dir that holds no metadata log; the message is one line
    saying how to create one."""

    exit_code = 2


class FormatRefused(PidctlError):
    """``pidctl format`` on a directory that is not new: already formatted, or holding
    files of something else."""


class AlreadyFormatted(FormatRefused):
    """The data dir already holds a metadata log (of cluster ``cluster_id``)."""

    def __init__(self, data_dir: Path, cluster_id: str | None) -> None:
        self.cluster_id = cluster_id
        super().__init__(f"{data_dir} is already formatted (cluster id {cluster_id})")

    def cli_lines(self) -> list[str]:
        return [f"{self}; nothing done"]


def is_formatted(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds a metadata log (a segment or a snapshot)."""
    try:
        names = os.listdir(data_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(name.endswith((SEGMENT_SUFFIX, SNAPSHOT_SUFFIX)) for name in names)


def check_formatted(data_dir: Path) -> None:
    """Raise :class:`NotFormatted` unless ``data_dir`` holds a metadata log."""
    if is_formatted(data_dir):
        return
    what = "does not exist" if not data_dir.exists() else "holds no metadata log"
    raise NotFormatted(
        f"data dir {data_dir} {what}: create it with `pidctl format --data-dir {data_dir}` "
        "(or check the path: a wrong working directory, a typo, a volume not mounted)"
    )


def stored_cluster_id(data_dir: Path) -> str | None:
    """The cluster id of a formatted data dir (read-only; safe while a server runs)."""
    return rebuild_state(read_log(data_dir))[0].cluster_id


def state_written_at(data_dir: Path, snapshot_offset: int) -> float | None:
    """When the state in ``data_dir`` was last written whole, in seconds since the epoch: the
    snapshot at ``snapshot_offset`` (its file's modification time), or with none (offset 0)
    the log's first record, written by ``pidctl format``. None if neither can be read."""
    try:
        if snapshot_offset:
            return (data_dir / snapshot_name(snapshot_offset)).stat().st_mtime
        with open(data_dir / segment_name(0), "rb") as segment:
            prefix = segment.read(8)
            if len(prefix) < 8:
                return None
            (length,) = struct.unpack(">I", prefix[:4])
            data = prefix + segment.read(min(length, MAX_RECORD_BYTES))
    except OSError:
        return None
    first = scan_segment(data, 0).entries
    return first[0].timestamp_ms / 1000 if first else None


def format_data_dir(
    data_dir: Path, cluster_id: str, node_id: int, now_ms: int, *, parents: bool = False
) -> None:
    """Create ``data_dir`` (if missing) with a metadata log whose first record is
    ``ClusterCreated(cluster_id, node_id)``, durably. Refuses a formatted data dir
    (:class:`AlreadyFormatted`), a directory holding anything else and, unless ``parents``,
    a data dir whose parent does not exist (:class:`FormatRefused`); raises
    ``DataDirLocked`` if a process holds it."""
    if data_dir.exists() and not data_dir.is_dir():
        raise FormatRefused(f"{data_dir} is not a directory")
    created = not data_dir.exists()
    if not created:
        _check_new(data_dir)
    missing = _missing_ancestors(data_dir)
    if missing and not parents:
        # A typo in an absolute path (/var/lib/pidtcl/data) or a volume not mounted: making
        # the directories would start a new cluster somewhere nobody looks.
        raise FormatRefused(
            f"{missing[-1]} does not exist: check the path (a typo, a volume not mounted), "
            "or pass --parents to create it"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    for made in reversed(missing):  # each new directory's entry in its parent, outermost first
        fsync_dir(made.resolve().parent)
    if created:
        fsync_dir(data_dir.resolve().parent)
    lock_fd = lock_data_dir(data_dir)
    try:
        _check_new(data_dir)  # again, under the lock: another format may have been first
        segment = data_dir / segment_name(0)
        tmp = segment.with_name(segment.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            entry = encode_entry(0, now_ms, ClusterCreated(cluster_id, node_id))
            written = 0
            while written < len(entry):
                written += os.write(fd, entry[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, segment)
        fsync_dir(data_dir)
    finally:
        os.close(lock_fd)


def _missing_ancestors(data_dir: Path) -> list[Path]:
    """The directories above ``data_dir`` that do not exist, nearest first."""
    missing = []
    parent = data_dir.absolute().parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing


def _check_new(data_dir: Path) -> None:
    if is_formatted(data_dir):
        cluster_id: str | None
        try:
            cluster_id = stored_cluster_id(data_dir)
        except Exception:  # a damaged log is still a log: never format over it
            cluster_id = "unreadable"
        raise AlreadyFormatted(data_dir, cluster_id)
    others = sorted(
        name
        for name in os.listdir(data_dir)
        if name not in _IGNORED_NAMES and not name.endswith(TMP_SUFFIX)
    )
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise FormatRefused(
            f"{data_dir} is not empty ({shown}) and holds no metadata log: format a new or "
            "empty directory"
        )
