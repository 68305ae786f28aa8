"""A state through a snapshot and back, as the log writes and reads one (for the tests)."""

from __future__ import annotations

from pidctl.controller.core.logformat import encode_entry, read_entries
from pidctl.controller.core.state import ControllerState


def through_snapshot(state: ControllerState) -> ControllerState:
    """``state`` restated as snapshot records, each framed and read back as the log frames
    them, and replayed into a new state."""
    framed = b"".join(encode_entry(at, 0, record) for at, record in state.snapshot_records())
    entries = ((entry.offset, entry.record) for entry in read_entries(framed))
    return ControllerState.from_snapshot_records(state.next_offset, entries)
