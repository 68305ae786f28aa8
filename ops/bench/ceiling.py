"""The framing ceiling: a minimal trio server that answers every request frame with a fixed,
pre-encoded response for its API and version (only the correlation id is copied in): an
ApiVersions listing, an InitProducerId PID, an AllocateProducerIds block. No state, no disk,
no decoding beyond the four bytes of API key and version: what the machine's Python, trio and
TCP allow before pidctl does anything.

    python -m ops.bench.ceiling 127.0.0.1:0     # prints the bound port, then serves
"""

from __future__ import annotations

import datetime
import struct
import sys
from typing import Any

import trio
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from pidctl.protocol.addresses import HostPort
from pidctl.protocol.api_versions import build_api_versions_response
from pidctl.protocol.apis import ApiKey, response_class, supported_apis
from pidctl.protocol.codec import encode_response_generic
from pidctl.protocol.framing import FrameDecoder
from pidctl.protocol.headers import RequestHeader

#: What the canned ApiVersions answer lists (and so what the ceiling answers at all).
CANNED_APIS = {
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
}


def _body(api_key: int, version: int) -> Any:
    if api_key == ApiKey.API_VERSIONS:
        return build_api_versions_response(version, supported_apis(CANNED_APIS))
    cls: Any = response_class(api_key, version)
    throttle = datetime.timedelta(0)
    if api_key == ApiKey.INIT_PRODUCER_ID:
        return cls(
            throttle_time=throttle,
            error_code=ErrorCode.none,
            producer_id=i64(0),
            producer_epoch=i16(0),
        )
    return cls(
        throttle_time=throttle,
        error_code=ErrorCode.none,
        producer_id_start=i64(0),
        producer_id_len=i32(1000),
    )


def canned_responses() -> dict[bytes, tuple[bytes, bytes]]:
    """For each request's first four bytes (API key, version): the answer's bytes before the
    correlation id (the length prefix) and after it."""
    canned = {}
    for api_key, (low, high) in CANNED_APIS.items():
        for version in range(low, high + 1):
            frame = encode_response_generic(
                RequestHeader(api_key, version, 0, None, 2), _body(api_key, version)
            )
            canned[struct.pack(">hh", api_key, version)] = (frame[:4], frame[8:])
    return canned


_CANNED = canned_responses()


async def _answer(stream: trio.SocketStream) -> None:
    decoder = FrameDecoder()
    async with stream:
        while data := await stream.receive_some(65536):
            out = bytearray()
            for frame in decoder.feed(data):
                # Request header: api key, version, then the correlation id at bytes 4..8.
                before, after = _CANNED[frame[:4]]
                out += before + frame[4:8] + after
            if out:
                await stream.send_all(out)


async def main(bind: str) -> None:
    address = HostPort.parse(bind)
    listeners = await trio.open_tcp_listeners(address.port, host=address.host)
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(_answer, listeners)


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:0")
