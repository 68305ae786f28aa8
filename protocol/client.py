"""Sans-IO client connection: requests out as bytes, responses in as typed kio entities.

Tracks correlation ids so pipelined requests are matched to their responses, and refuses a
response that arrives out of order (Kafka answers a connection's requests in order).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from kio.static.protocol import RequestPayload

from pidctl.protocol.codec import (
    decode_response,
    encode_request,
    encode_request_prefix,
    peek_correlation_id,
)
from pidctl.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder

#: int32 correlation ids wrap around here.
_CORRELATION_LIMIT: Final = 2**31


class _Own:
    """``send``'s default client id: the connection's own (None is a client id too: null)."""


_OWN: Final = _Own()


class ResponseOrderError(Exception):
    """A response's correlation id is not the one of the oldest outstanding request."""


class ClientProtocol:
    """One client connection's protocol state (no I/O)."""

    def __init__(
        self, client_id: str | None = "pidctl", max_frame_bytes: int = 16 * DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.client_id = client_id
        self._next_correlation_id = 0
        self._outstanding: deque[tuple[int, int, int]] = deque()
        self._decoder = FrameDecoder(max_frame_bytes)

    @property
    def outstanding(self) -> int:
        """Requests sent whose responses have not arrived yet."""
        return len(self._outstanding)

    def send(self, body: RequestPayload, client_id: str | _Own | None = _OWN) -> tuple[int, bytes]:
        """Encode a request; return its correlation id and the bytes to write. The header
        carries the connection's client id, or ``client_id`` when given (a request that
        names something in it, as a job's AllocateProducerIds does)."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) % _CORRELATION_LIMIT
        self._outstanding.append((correlation_id, body.__api_key__, body.__version__))
        header_client_id = self.client_id if isinstance(client_id, _Own) else client_id
        return correlation_id, encode_request(body, correlation_id, header_client_id)

    def send_prefix(self, api_key: int, api_version: int, body_size: int) -> tuple[int, bytes]:
        """Like :meth:`send` for a body the caller has encoded itself (``body_size`` bytes,
        written right after the bytes returned): the frame's length prefix and header."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) % _CORRELATION_LIMIT
        self._outstanding.append((correlation_id, api_key, api_version))
        prefix = encode_request_prefix(
            api_key, api_version, correlation_id, self.client_id, body_size
        )
        return correlation_id, prefix

    def receive(self, data: bytes) -> list[tuple[int, Any]]:
        """Feed received bytes; return ``(correlation_id, response)`` for each complete one."""
        responses = []
        for frame in self._decoder.feed(data):
            correlation_id = peek_correlation_id(frame)
            if not self._outstanding:
                raise ResponseOrderError(f"response {correlation_id} to no request")
            expected, api_key, api_version = self._outstanding.popleft()
            if correlation_id != expected:
                raise ResponseOrderError(
                    f"response {correlation_id} arrived while {expected} was expected"
                )
            responses.append((correlation_id, decode_response(frame, api_key, api_version)))
        return responses
