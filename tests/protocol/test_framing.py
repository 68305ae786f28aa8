from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidctl.protocol.framing import FrameDecoder, FrameTooLarge, frame


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_any_chunking_yields_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_bytes=1000)
    out: list[bytes] = []
    for start, end in itertools.pairwise(points):
        out.extend(decoder.feed(stream[start:end]))
    assert out == payloads
    assert decoder.buffered_bytes == 0


def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">i", 101))
    assert info.value.size == 101


def test_negative_length_is_refused() -> None:
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(struct.pack(">i", -1))


def test_frame_at_the_limit_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    assert decoder.feed(frame(b"x" * 100)) == [b"x" * 100]


def test_partial_frame_is_buffered() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(frame(b"abc")[:5]) == []
    assert decoder.in_frame
    assert decoder.feed(b"bc") == [b"abc"]
    assert not decoder.in_frame
