"""Frames for the struct readers' tests: a well-formed frame damaged the ways a network or
a client may damage it."""

from __future__ import annotations

from hypothesis import strategies as st


def damaged(frame: bytes, data: st.DataObject) -> bytes:
    """``frame`` truncated, extended or with a byte changed, at a place ``data`` draws."""
    where = data.draw(st.integers(0, len(frame)))
    change = data.draw(st.sampled_from(["cut", "add", "flip"]))
    if change == "cut":
        return frame[:where]
    if change == "add":
        return frame[:where] + data.draw(st.binary(min_size=1, max_size=3)) + frame[where:]
    at = min(where, len(frame) - 1)
    return frame[:at] + bytes([frame[at] ^ data.draw(st.integers(1, 255))]) + frame[at + 1 :]
