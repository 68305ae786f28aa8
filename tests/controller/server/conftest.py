from __future__ import annotations

import collections
import math
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from kio.static.protocol import RequestPayload

from pidctl.controller.api.access import ConnectionInfo, RequestLimits
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.pool_grants import for_pool
from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.core.records import Record
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.log.metalog import CommitListener, MetadataLog
from pidctl.controller.log.sync_place import DEFAULT_INLINE_SYNC_MAX_S
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.accounting import Accounting
from pidctl.controller.server.transport.admission import standard_socket
from pidctl.controller.server.transport.connection import ConnectionLimits, ConnectionTasks, now
from pidctl.controller.server.transport.outbox import SocketWriter, StreamWriter
from pidctl.controller.server.transport.poller import Poller, available
from pidctl.controller.server.transport.socket_io import close_socket
from pidctl.protocol.client import ClientProtocol

#: (server side, client side) of one loopback TCP connection.
TcpPair = tuple[trio.SocketStream, trio.SocketStream]

#: How long a test waits for an answer at most. Memory streams under a mock clock reach it
#: only when nothing else can happen (then at once); real sockets on a busy machine need room.
ANSWER_BOUND_S = 30.0


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


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (for :data:`ANSWER_BOUND_S` at most): after every
    other task has run as far as it can, then every millisecond."""
    with trio.fail_after(ANSWER_BOUND_S):
        await trio.testing.wait_all_tasks_blocked()
        while not condition():
            await trio.sleep(0.001)


def limits(**changes: Any) -> ConnectionLimits:
    """The connection settings at their shipped defaults, but for ``changes``."""
    values: dict[str, Any] = {
        "max_frame_bytes": 1024 * 1024,
        "idle_timeout_s": 600.0,
        "frame_timeout_s": 30.0,
        "max_in_flight": 100,
        "sasl_mechanisms": ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
    }
    values.update(changes)
    return ConnectionLimits(**values)


def frame(payload: bytes) -> bytes:
    """``payload`` with Kafka's int32 length prefix."""
    return struct.pack(">i", len(payload)) + payload


class Peer:
    """The client side of one connection: kio requests out, typed responses in, through
    pidctl's own sans-IO :class:`ClientProtocol` (which refuses an answer out of order)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.protocol = ClientProtocol("test")
        self._answers: collections.deque[Any] = collections.deque()

    def encode(self, *bodies: RequestPayload) -> bytes:
        return b"".join(self.protocol.send(body)[1] for body in bodies)

    async def send(self, *bodies: RequestPayload) -> None:
        """The requests in one write."""
        await self.stream.send_all(self.encode(*bodies))

    async def receive(self) -> Any:
        """The next answer, in order."""
        with trio.fail_after(ANSWER_BOUND_S):
            while not self._answers:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise AssertionError("the server closed the connection")
                self._answers.extend(body for _, body in self.protocol.receive(bytes(data)))
        return self._answers.popleft()

    async def request(self, body: RequestPayload) -> Any:
        await self.send(body)
        return await self.receive()

    async def closed(self, bound_s: float = ANSWER_BOUND_S) -> list[Any]:
        """Read until the server closes (for ``bound_s`` at most); the answers that came
        before."""
        answers = list(self._answers)
        self._answers.clear()
        with trio.fail_after(bound_s):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:  # a reset: closed with our bytes unread
                    return answers
                if not data:
                    return answers
                answers.extend(body for _, body in self.protocol.receive(bytes(data)))


@dataclass
class Served:
    """A real :class:`ConnectionTasks` in this process, as ``pidctl serve`` wires it: a real
    controller over a real metadata log in a temporary dir, the watchdog and the poller
    running. Connections come over memory streams (the path TLS takes: the task waits for
    the log and writes itself) or loopback TCP (outboxes and the poller)."""

    server: ConnectionTasks
    controller: Controller
    log: MetadataLog
    metrics: Metrics
    nursery: trio.Nursery
    listener: trio.SocketListener
    #: Every record applied, in order (the controller's observers see each).
    records: list[Record] = field(default_factory=list)
    #: Why each connection ended (what :meth:`ConnectionTasks.serve` returned), in order.
    reasons: list[str] = field(default_factory=list)

    async def start_log(self) -> None:
        """Start the log's writer (``serving(start_log=False)``: nothing is durable before)."""
        await self.nursery.start(self.log.run)

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def connect(
        self,
        transport: str,
        *,
        sasl: bool = False,
        setup: Callable[[socket.socket], None] | None = None,
    ) -> Peer:
        """A new connection, served as the admission serves one (closed once served): a
        memory stream (as TLS is served) or a TCP socket; ``setup`` is called with the
        server's socket first (TCP)."""
        client: trio.abc.Stream
        if transport == "memory":
            client, server_side = trio.testing.memory_stream_pair()
            self.nursery.start_soon(self._serve_stream, server_side, sasl)
        else:
            port = self.listener.socket.getsockname()[1]
            client = await trio.open_tcp_stream("127.0.0.1", port)
            accepted = await self.listener.accept()
            sock = standard_socket(accepted.socket)  # as the admission has it
            if setup is not None:
                setup(sock)
            self.nursery.start_soon(self._serve_socket, sock, sasl)
        return Peer(client)

    async def _serve_stream(self, stream: trio.abc.Stream, sasl: bool) -> None:
        async with stream:
            reason = await self.server.serve(stream, ConnectionInfo(peer="test"), sasl)
            self.reasons.append(reason)  # before the close: a client seeing it may look

    async def _serve_socket(self, sock: socket.socket, sasl: bool) -> None:
        try:
            reason = await self.server.serve(sock, ConnectionInfo(peer="test"), sasl)
            self.reasons.append(reason)  # before the close: a client seeing it may look
        finally:
            close_socket(sock)


@asynccontextmanager
async def serving(
    data_dir: Path,
    *,
    connection_limits: ConnectionLimits | None = None,
    quotas: Quotas | None = None,
    credentials: CredentialStore | None = None,
    request_limits: RequestLimits | None = None,
    start_log: bool = True,
    log_requests: bool = False,
) -> AsyncIterator[Served]:
    """See :class:`Served`."""
    state = ControllerState()
    metrics = Metrics()
    # Wired as server/app.py wires them: what the log tells is built before the log.
    durable = DurableOffsets(0)
    accounting = Accounting(quotas or Quotas({}), metrics, log_requests=log_requests)
    writer = SocketWriter(durable, accounting.sent)

    class Committed(CommitListener):
        def committed(self, durable_end: int) -> None:
            writer.release(durable_end)

    quorum: QuorumController
    # Under trio's mock clock every commit stays on the loop: the clock would jump while the
    # log's thread works (a commit nobody waits for runs there).
    mock_clock = isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
    log = MetadataLog(
        data_dir,
        0,
        0,
        lambda: quorum.snapshot(),
        listener=Committed(),
        inline_sync_max_s=math.inf if mock_clock else DEFAULT_INLINE_SYNC_MAX_S,
        durable=durable,
    )
    records: list[Record] = []
    pool_grants = for_pool(state)
    quorum = QuorumController(
        state, log, (pool_grants.applied, lambda offset, record: records.append(record))
    )
    controller = Controller(quorum, pool_grants=pool_grants, limits=request_limits)
    quorum.apply(state.cluster.create_cluster("test-cluster", 1), now())
    records.clear()  # (those the test makes)
    store = credentials or CredentialStore()
    server = ConnectionTasks(
        controller,
        accounting,
        writer,
        StreamWriter(durable, accounting.sent),
        metrics,
        lambda: store,
        connection_limits or limits(),
        poller=Poller() if available() else None,
    )
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        served = Served(server, controller, log, metrics, nursery, listener, records)
        await nursery.start(server.writer.run)
        nursery.start_soon(server.watch)
        nursery.start_soon(server.poll)
        if start_log:
            await served.start_log()
        yield served
        nursery.cancel_scope.cancel()
    await listener.aclose()
