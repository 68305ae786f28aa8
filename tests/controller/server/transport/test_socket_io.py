"""Plain TCP on the descriptor: reads wait for data, writes wait only for room, broken and
closed connections end as they do with trio's own streams. Over real loopback TCP."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing

from pidctl.controller.server.transport.socket_io import SocketIO
from tests.controller.server.conftest import TcpPair


async def test_a_read_waits_for_data_and_ends_with_the_stream(tcp_pair: TcpPair) -> None:
    server, client = tcp_pair
    io = SocketIO(server.socket.fileno())
    got: list[bytes] = []

    async def read() -> None:
        got.append(await io.receive_some(1024))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing sent yet: waiting, not spinning
        await client.send_all(b"request")
    assert got == [b"request"]
    await client.send_eof()
    assert await io.receive_some(1024) == b""


async def test_a_write_larger_than_the_socket_buffers_waits_for_the_reader(
    tcp_pair: TcpPair,
) -> None:
    server, client = tcp_pair
    data = bytes(range(256)) * (32 * 1024)  # 8 MiB: far more than the kernel buffers take
    received = bytearray()

    async def read_slowly() -> None:
        while len(received) < len(data):
            received.extend(await client.receive_some(64 * 1024))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(SocketIO(server.socket.fileno()).send_all, data)
        await trio.testing.wait_all_tasks_blocked()  # the writer now waits for room
        nursery.start_soon(read_slowly)
    assert received == data


async def test_a_connection_reset_by_the_peer_is_broken(tcp_pair: TcpPair) -> None:
    server, client = tcp_pair
    # SO_LINGER 0: close sends a reset instead of a FIN.
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.socket.close()
    io = SocketIO(server.socket.fileno())
    with pytest.raises(trio.BrokenResourceError):
        await io.receive_some(1024)
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may land before the reset is seen
            await io.send_all(b"x" * 65536)


async def test_a_waiting_read_ends_when_cancelled_or_closed(tcp_pair: TcpPair) -> None:
    server, _ = tcp_pair
    io = SocketIO(server.socket.fileno())
    with trio.move_on_after(0.01) as scope:
        await io.receive_some(1024)
    assert scope.cancelled_caught

    async def close_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        server.socket.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        with pytest.raises(trio.ClosedResourceError):
            await io.receive_some(1024)


async def test_nothing_is_read_or_written_after_close(tcp_pair: TcpPair) -> None:
    server, client = tcp_pair
    io = SocketIO(server.socket.fileno())
    io.close()  # the socket itself stays open: only this object lets go of the number
    with pytest.raises(trio.ClosedResourceError):
        io.send_now(b"late")
    with pytest.raises(trio.ClosedResourceError):
        await io.send_all(b"late")
    with pytest.raises(trio.ClosedResourceError):
        await io.receive_some(1024)
    await server.send_all(b"end")
    assert await client.receive_some(1024) == b"end"  # nothing of "late" came first
