"""Frames for the struct readers' tests: a well-formed frame damaged the ways a network or
a client may damage it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from pidctl.protocol.apis import SupportedApis
from pidctl.protocol.codec import ProtocolViolation, decode_request

T = TypeVar("T")

#: The fields the readers' tests draw.
int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
client_ids = st.none() | st.text(max_size=20)


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


def read_only_as_kio_reads(
    frame: bytes,
    read: Callable[[bytes], T | None],
    kio_reads_it_so: Callable[[bytes, T], Any],
    supported: SupportedApis,
) -> None:
    """Whatever ``read`` accepts of ``frame``, kio reads as the same request
    (``kio_reads_it_so`` checks it); what it leaves, kio reads or refuses."""
    value = read(frame)
    if value is not None:
        kio_reads_it_so(frame, value)
    else:
        with contextlib.suppress(ProtocolViolation):  # (refused by both)
            decode_request(frame, supported)
