"""The writers: answers leave once the real metadata log has made them durable, in the order they
were posted; a write the kernel does not take whole is finished by a task; nothing is written
for a connection that has ended; a TLS connection's answers go the same way. Over real
loopback TCP and a real log in a temporary dir."""

from __future__ import annotations

import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from pidctl.controller.api.responses import NO_WAIT
from pidctl.controller.core.logformat import encode_entry
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import CommitListener, MetadataLog
from pidctl.controller.server.transport.outbox import Outbox, SocketWriter, StreamWriter, Timings
from pidctl.controller.server.transport.socket_io import SocketIO, StreamIO
from tests.controller.server.conftest import TcpPair


@dataclass
class Setup:
    log: MetadataLog
    writer: SocketWriter
    server: trio.SocketStream
    client: trio.SocketStream
    sent: list[tuple[int, Timings]] = field(default_factory=list)

    def outbox(self) -> Outbox:
        return self.writer.outbox(SocketIO(self.server.socket.fileno()))

    def append(self) -> int:
        """A record for the next commit; its offset."""
        n = self.log.end_offset
        grant = ProducerIdsGranted(1, 1, n * 10, n * 10 + 10)
        return self.log.append_entry(encode_entry(n, 0, grant))

    def client_has_nothing(self) -> bool:
        try:
            os.read(self.client.socket.fileno(), 1)  # trio's sockets do not block
        except BlockingIOError:
            return True
        return False

    async def receive(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            data += await self.client.receive_some(size - len(data))
        return bytes(data)


@pytest.fixture
async def setup(tmp_path: Path, tcp_pair: TcpPair) -> AsyncIterator[Setup]:
    server, client = tcp_pair
    state = ControllerState()
    writer: SocketWriter | None = None

    class Committed(CommitListener):
        def committed(self, durable_end: int) -> None:
            assert writer is not None
            writer.release(durable_end)

    log = MetadataLog(tmp_path, 0, 0, lambda: state.copy().snapshot_records, listener=Committed())
    sent: list[tuple[int, Timings]] = []
    writer = SocketWriter(log.durable, lambda size, timings: sent.append((size, timings)))
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await nursery.start(log.run)
        yield Setup(log, writer, server, client, sent)
        nursery.cancel_scope.cancel()


async def test_answers_wait_for_the_log_and_leave_in_order(setup: Setup) -> None:
    outbox = setup.outbox()
    offset = setup.append()
    setup.writer.post(outbox, offset, b"first", [("allocate_producer_ids", 0.0)])
    # Needs nothing from the log, but was decided after the first: it waits behind it.
    setup.writer.post(outbox, NO_WAIT, b"second", [("api_versions", 0.0)])
    assert setup.client_has_nothing()
    assert outbox.requests == 2
    await setup.log.flush()
    assert await setup.receive(11) == b"firstsecond"
    assert outbox.requests == 0 and outbox.empty
    assert setup.sent == [(11, [("allocate_producer_ids", 0.0), ("api_versions", 0.0)])]


async def test_an_answer_already_durable_is_written_at_once(setup: Setup) -> None:
    outbox = setup.outbox()
    offset = setup.append()
    await setup.log.flush()
    setup.writer.post(outbox, offset, b"now", [])
    assert outbox.empty
    assert await setup.receive(3) == b"now"


async def test_a_write_the_kernel_does_not_take_whole_is_finished_in_order(setup: Setup) -> None:
    outbox = setup.outbox()
    big = bytes(range(256)) * (32 * 1024)  # 8 MiB: more than the kernel buffers take
    setup.writer.post(outbox, setup.append(), big, [("metadata", 0.0)])
    await setup.log.flush()
    assert outbox.stalled  # the rest waits for room, in a task of its own
    setup.writer.post(outbox, NO_WAIT, b"after", [])  # behind the rest, never into it
    setup.writer.post(outbox, setup.append(), b"durable", [])
    assert await setup.receive(len(big) + 12) == big + b"afterdurable"
    await outbox.wait_empty()
    assert not outbox.stalled and outbox.requests == 0
    assert sum(size for size, _ in setup.sent) == len(big) + 12


async def test_nothing_is_written_for_a_connection_that_ended(setup: Setup) -> None:
    outbox = setup.outbox()
    setup.writer.post(outbox, setup.append(), b"late", [])
    setup.writer.discard(outbox)
    await outbox.wait_empty()  # does not wait for the log any more
    await setup.log.flush()
    assert setup.client_has_nothing()
    setup.writer.post(outbox, NO_WAIT, b"later", [])
    assert setup.client_has_nothing()


async def test_a_stalled_write_stops_when_its_connection_ends(setup: Setup) -> None:
    """The task finishing a write wakes when there is room; if the connection ended before,
    it writes nothing (its descriptor may be another connection's by then)."""
    outbox = setup.outbox()
    big = b"x" * (64 * 1024 * 1024)  # far more than the kernel's buffers ever hold
    offset = setup.append()
    await setup.log.flush()
    setup.writer.post(outbox, offset, big, [])  # durable already: written at once, in part
    assert outbox.stalled
    [(written, _)] = setup.sent  # what the kernel took before its buffer filled
    await trio.testing.wait_all_tasks_blocked()  # the finishing task now waits for room
    setup.writer.discard(outbox)
    received = 0
    with trio.fail_after(10):
        while True:  # room now: the task wakes, and must not write
            try:
                received += len(os.read(setup.client.socket.fileno(), 1 << 20))
            except BlockingIOError:
                if not outbox.stalled:
                    break
                await trio.sleep(0.01)
    assert written <= received < len(big)
    assert setup.client_has_nothing()
    assert setup.sent == [(written, ())]


async def test_a_connection_reset_by_the_client_is_broken(setup: Setup) -> None:
    outbox = setup.outbox()
    setup.client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    setup.client.socket.close()
    with trio.fail_after(10):
        while not outbox.broken:  # the first writes may land before the reset is seen
            setup.writer.post(outbox, setup.append(), b"x" * 65536, [])
            await setup.log.flush()
    await outbox.wait_empty()


async def test_a_tls_connections_answers_leave_by_its_own_writer(setup: Setup) -> None:
    """TLS cannot write without awaiting: its task awaits the StreamWriter's write, which writes an
    answer only once it is durable, encrypted (a real TLS session over the loopback pair),
    and nothing for a connection that ended."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    server = trio.SSLStream(setup.server, server_context, server_side=True)
    client = trio.SSLStream(setup.client, client_context, server_hostname="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    outbox = setup.writer.outbox(StreamIO(server))
    # Each write with the log's durable end at the time.
    written: list[tuple[int, Timings, int]] = []
    durable = setup.log.durable
    tls = StreamWriter(durable, lambda n, t: written.append((n, t, durable.durable_end)))
    offset = setup.append()
    with trio.fail_after(10):
        await tls.write(outbox, offset, b"first", [])
        await tls.write(outbox, NO_WAIT, b"second", [("api_versions", 0.0)])
        data = b""
        while len(data) < 11:
            data += await client.receive_some(11 - len(data))
    assert data == b"firstsecond"
    assert [(n, t) for n, t, _ in written] == [(5, []), (6, [("api_versions", 0.0)])]
    assert written[0][2] > offset  # written once durable, not before
    setup.writer.discard(outbox)
    await tls.write(outbox, NO_WAIT, b"after the end", [])
    assert len(written) == 2 and outbox.broken
