"""docs/connection-states.md is the picture ops/connection_states.py draws from the table."""

from __future__ import annotations

from ops.connection_states import PAGE, mermaid, page
from pidctl.protocol.server import PHASE_CHANGES


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == page(), "run: python -m ops.connection_states --write"


def test_every_change_is_drawn() -> None:
    drawn = mermaid()
    assert all(change.why in drawn and change.target.name in drawn for change in PHASE_CHANGES)
