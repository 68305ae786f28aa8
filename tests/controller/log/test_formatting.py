"""Creating a data dir: what `pidctl format` accepts, refuses and writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidctl.controller.core.records import ClusterCreated
from pidctl.controller.log.formatting import (
    AlreadyFormatted,
    FormatRefused,
    NotFormatted,
    check_formatted,
    format_data_dir,
    is_formatted,
    stored_cluster_id,
)
from pidctl.controller.log.recovery import read_log, recover


def test_a_new_data_dir_holds_one_cluster_created_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    assert not is_formatted(data_dir)
    format_data_dir(data_dir, "c1", 3, 1_700_000_000_000)
    assert is_formatted(data_dir)
    [entry] = read_log(data_dir).entries()
    assert (entry.offset, entry.timestamp_ms) == (0, 1_700_000_000_000)
    assert entry.record == ClusterCreated("c1", 3)
    assert stored_cluster_id(data_dir) == "c1"
    assert recover(data_dir).state.next_offset == 1
    assert not list(data_dir.glob("*.tmp"))


def test_a_missing_parent_is_refused_unless_asked_for(tmp_path: Path) -> None:
    """A typo'd absolute path (/var/lib/pidtcl/data) or a volume not mounted: format makes
    no directories above the data dir unless told to (--parents)."""
    data_dir = tmp_path / "typo" / "deeper" / "data"
    with pytest.raises(FormatRefused, match=r"typo does not exist: .* pass --parents"):
        format_data_dir(data_dir, "c1", 1, 1)
    assert list(tmp_path.iterdir()) == []
    format_data_dir(data_dir, "c1", 1, 1, parents=True)
    assert stored_cluster_id(data_dir) == "c1"


def test_a_formatted_data_dir_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    format_data_dir(tmp_path, "c1", 1, 1)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(AlreadyFormatted) as refused:
        format_data_dir(tmp_path, "c2", 1, 2)
    assert refused.value.cluster_id == "c1"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_new_volume_and_an_interrupted_format_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "lost+found").mkdir()  # a new ext4 volume
    (tmp_path / ".lock").write_text("123\n")  # an interrupted format's leftovers
    (tmp_path / "00000000000000000000.log.tmp").write_bytes(b"\0" * 10)
    format_data_dir(tmp_path, "c1", 1, 1)
    assert stored_cluster_id(tmp_path) == "c1"


def test_a_directory_of_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FormatRefused, match=r"not empty \(notes.txt\)"):
        format_data_dir(tmp_path, "c1", 1, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    a_file = tmp_path / "notes.txt"
    with pytest.raises(FormatRefused, match="not a directory"):
        format_data_dir(a_file, "c1", 1, 1)


def test_check_formatted_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(NotFormatted, match="does not exist: create it with `pidctl format"):
        check_formatted(tmp_path / "missing")
    with pytest.raises(NotFormatted, match="holds no metadata log"):
        check_formatted(tmp_path)
    format_data_dir(tmp_path, "c1", 1, 1)
    check_formatted(tmp_path)
