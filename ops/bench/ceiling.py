"""The framing ceiling: a minimal trio server that answers every request frame with one fixed,
pre-encoded InitProducerId response (only the correlation id is copied in). No state, no
disk, no decoding: what the machine's Python, trio and TCP allow before pidctl does anything.

    python -m ops.bench.ceiling 127.0.0.1:0     # prints the bound port, then serves
"""

from __future__ import annotations

import datetime
import sys

import trio
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v5 import InitProducerIdResponse
from kio.schema.types import ProducerId
from kio.static.primitive import i16, i32Timedelta

from pidctl.protocol.addresses import HostPort
from pidctl.protocol.codec import encode_response
from pidctl.protocol.framing import FrameDecoder
from pidctl.protocol.headers import RequestHeader

_RESPONSE = encode_response(
    RequestHeader(22, 5, 0, None, 2),
    InitProducerIdResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        producer_id=ProducerId(0),
        producer_epoch=i16(0),
    ),
)


async def _answer(stream: trio.SocketStream) -> None:
    decoder = FrameDecoder()
    async with stream:
        while data := await stream.receive_some(65536):
            out = bytearray()
            for frame in decoder.feed(data):
                # Request header: api key, version, then the correlation id at bytes 4..8.
                out += _RESPONSE[:4] + frame[4:8] + _RESPONSE[8:]
            if out:
                await stream.send_all(out)


async def main(bind: str) -> None:
    address = HostPort.parse(bind)
    listeners = await trio.open_tcp_listeners(address.port, host=address.host)
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(_answer, listeners)


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:0")
