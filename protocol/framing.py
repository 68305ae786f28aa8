"""Kafka's size-prefixed framing: every request and response is a big-endian int32 length
followed by that many bytes."""

from __future__ import annotations

import struct

#: Default for the ``max_frame_bytes`` setting. Kafka's ``socket.request.max.bytes`` is 100 MiB
#: because Produce requests carry data; every request pidctl serves fits in a few hundred bytes
#: (the largest, BrokerRegistration, lists listeners and features), so 1 MiB leaves ample room
#: while bounding what one hostile client can make us buffer.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024

_LENGTH = struct.Struct(">i")
LENGTH_PREFIX_BYTES = _LENGTH.size


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
        return self.buffered_bytes > 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add received bytes and return the frames (bodies, without length) now complete."""
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        start = self._start
        end = len(buffer)
        while end - start >= LENGTH_PREFIX_BYTES:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size < 0 or size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)
            frame_end = start + LENGTH_PREFIX_BYTES + size
            if frame_end > end:
                break
            frames.append(bytes(buffer[start + LENGTH_PREFIX_BYTES : frame_end]))
            start = frame_end
        # Drop consumed bytes once they dominate the buffer, keeping feed() amortised O(n).
        if start and start * 2 >= len(buffer):
            del buffer[:start]
            start = 0
        self._start = start
        return frames


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length, as Kafka frames every message."""
    return _LENGTH.pack(len(payload)) + payload
