"""Kafka's size-prefixed framing: every request and response is a big-endian int32 length
followed by that many bytes."""

from __future__ import annotations

import struct
from typing import Final

#: Default for the ``max_frame_bytes`` setting. Kafka's ``socket.request.max.bytes`` is 100 MiB
#: because Produce requests carry data; every request pidctl serves fits in a few hundred bytes
#: (the largest, BrokerRegistration, lists listeners and features), so 1 MiB leaves ample room
#: while bounding what one hostile client can make us buffer.
DEFAULT_MAX_FRAME_BYTES: Final = 1024 * 1024

_LENGTH: Final = struct.Struct(">i")
LENGTH_PREFIX_BYTES: Final = _LENGTH.size


class FrameError(Exception):
    """The byte stream cannot be split into frames; the connection must be closed."""


class FrameTooLarge(FrameError):
    """A frame declared a size above the limit (or a negative size)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds max_frame_bytes={limit}")
        self.size = size
        self.limit = limit


class FrameDecoder:
    """Splits a byte stream into frames without copying more than necessary.

    Feed it whatever the transport delivered; it returns every frame now complete. An
    oversized length prefix raises :class:`FrameTooLarge` before any of the body is buffered,
    so a client cannot make us hold more than ``max_frame_bytes`` per connection.
    """

    __slots__ = ("_buffer", "_start", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._start = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as part of a frame."""
        return len(self._buffer) - self._start

    @property
    def in_frame(self) -> bool:
        """True while part of a frame has arrived but not all of it."""
        return len(self._buffer) > self._start

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add received bytes and return the frames (bodies, without length) now complete."""
        buffer = self._buffer
        if not buffer and type(data) is bytes:
            # Nothing held back (a read of whole requests, the usual case): the frames are
            # cut from ``data`` itself and only an unfinished one is kept.
            frames, start = self._split(data, 0)
            if start < len(data):
                buffer += data[start:]
            return frames
        buffer += data
        frames, start = self._split(buffer, self._start)
        # Drop consumed bytes once they dominate the buffer, keeping feed() amortised O(n).
        if start and start * 2 >= len(buffer):
            del buffer[:start]
            start = 0
        self._start = start
        return frames

    def _split(self, data: bytes | bytearray, start: int) -> tuple[list[bytes], int]:
        """The whole frames in ``data`` from ``start``, and where the first unfinished one
        begins; raises :class:`FrameTooLarge` at a length prefix above the limit."""
        frames: list[bytes] = []
        end = len(data)
        limit = self.max_frame_bytes
        while end - start >= LENGTH_PREFIX_BYTES:
            (size,) = _LENGTH.unpack_from(data, start)
            if size < 0 or size > limit:
                raise FrameTooLarge(size, limit)
            frame_end = start + LENGTH_PREFIX_BYTES + size
            if frame_end > end:
                break
            frames.append(bytes(data[start + LENGTH_PREFIX_BYTES : frame_end]))
            start = frame_end
        return frames, start


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length, as Kafka frames every message."""
    return _LENGTH.pack(len(payload)) + payload
