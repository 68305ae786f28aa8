from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

#: (server side, client side) of one loopback TCP connection.
TcpPair = tuple[trio.SocketStream, trio.SocketStream]


@pytest.fixture
async def tcp_pair() -> AsyncIterator[TcpPair]:
    """(server side, client side) of one real loopback TCP connection."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
    server = await listener.accept()
    await listener.aclose()
    yield server, client
    await server.aclose()
    await client.aclose()
