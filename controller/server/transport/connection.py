"""One trio task per client connection, driving a sans-IO :class:`ServerConnection`.

The task reads, feeds the bytes to the connection object, has the controller decide each
request in arrival order, and posts all the answers of one round, as one write, to the
connection's outbox (outbox.py), the one way answers leave: they are written once the log
has made everything they decided durable. On a plain TCP connection the commit making them
durable writes them, and the task reads on meanwhile; at most ``max_in_flight`` requests
wait for their answers before it stops reading, and a client that stops reading our answers
is pushed back by TCP. A TLS connection cannot write without awaiting: its task has the
outbox write them (waiting for the log) before it reads again.
While a plain TCP connection has nothing but its next request to wait for, its task parks
in the :class:`Poller`, which runs its rounds (read, decide, post) with every other parked
connection's in one task; the connection's task wakes for what a round cannot do without it
(a SASL exchange, a throttle, a full outbox, the connection's end).
Deadlines (idle, half-sent frame) are data on the connection object, enforced by one
watchdog task for all connections rather than a cancel scope per read.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog
import trio

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.responses import NO_WAIT
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.server.security.sasl_session import SaslSession
from pidctl.controller.server.telemetry.metrics import Metrics, api_name
from pidctl.controller.server.transport.accounting import Accounting
from pidctl.controller.server.transport.decided import Answers, Round
from pidctl.controller.server.transport.hangups import Hangups
from pidctl.controller.server.transport.outbox import (
    Outbox,
    SocketWriter,
    StreamWriter,
)
from pidctl.controller.server.transport.poller import Poller
from pidctl.controller.server.transport.rounds import Rounds, now
from pidctl.controller.server.transport.socket_io import SocketIO, StreamIO
from pidctl.controller.settings import DEFAULT_MAX_ENTRIES_PER_ROUND, DEFAULT_MAX_UNWRITTEN_BYTES
from pidctl.protocol.server import ConnectionClosed, Phase, ServerConnection

#: ``now`` is the rounds' clock (``rounds.py``), for the server's other decisions too.
__all__ = ["ConnectionLimits", "ConnectionTasks", "LiveConnection", "now"]

log: Final = structlog.get_logger("pidctl.server")

#: Bytes asked of the socket per read. Requests are small; 64 KiB takes many pipelined ones
#: in one system call without holding much memory per connection.
RECEIVE_BYTES: Final = 64 * 1024
#: How often the watchdog looks at the connections' deadlines at most; a deadline is met
#: within this (or a quarter of the shortest timeout, whichever is less).
WATCHDOG_PERIOD_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The settings one connection runs under."""

    max_frame_bytes: int
    idle_timeout_s: float
    frame_timeout_s: float
    max_in_flight: int
    sasl_mechanisms: tuple[str, ...]
    max_entries_per_round: int = DEFAULT_MAX_ENTRIES_PER_ROUND
    max_unwritten_bytes: int = DEFAULT_MAX_UNWRITTEN_BYTES


@dataclass(eq=False, slots=True)
class LiveConnection:
    """What the watchdog and the shutdown need to know of a running connection."""

    connection: ServerConnection
    #: The socket's descriptor (a TLS connection's too), for watching it while muted.
    descriptor: int = -1
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reading: bool = False
    stopping: bool = False

    def stop(self) -> None:
        """Shutdown: stop reading; answers in progress are finished first."""
        self.stopping = True
        if self.reading:
            self.scope.cancel()


class ConnectionTasks:
    """Serves connections: one :meth:`serve` task each, one :meth:`watch` task for all.
    (The trio side; ``protocol.server.ServerConnection`` is one connection's sans-IO
    protocol state, which each task drives.)"""

    def __init__(
        self,
        controller: Controller,
        accounting: Accounting,
        writer: SocketWriter,
        stream_writer: StreamWriter,
        metrics: Metrics,
        credentials: Callable[[], CredentialStore],
        limits: ConnectionLimits,
        *,
        poller: Poller | None = None,
    ) -> None:
        """``poller``: runs the rounds of idle plain-TCP connections (see poller.py) once
        :meth:`poll` runs; None (where there is no epoll, say) and every connection reads in
        its own task. ``writer`` and ``stream_writer``: the writers, one per transport:
        plain TCP's (what the purgatory releases after each commit), TLS's (awaited by the
        connection's task), built with ``accounting`` as what they tell of each write."""
        self.controller = controller
        self.metrics = metrics
        self.credentials = credentials
        self.limits = limits
        self.live: set[LiveConnection] = set()
        self._stopped = False
        #: What is counted of each request and answer (quotas, metrics, the request log).
        self.accounting: Final[Accounting] = accounting
        #: Decides the connections' rounds, each request by the answerer of its kind.
        self.rounds = Rounds(controller, accounting, limits.max_entries_per_round)
        self.writer: Final[SocketWriter] = writer
        self.stream_writer: Final[StreamWriter] = stream_writer
        self.poller = poller
        metrics.connections_polled.set_function(lambda: 0 if poller is None else len(poller))
        #: Mutes throttled connections, ending a mute when its client hangs up.
        self.hangups = Hangups()

    async def poll(self) -> None:
        """Run the poller and the watch of muted connections until cancelled (cancel it
        after :meth:`stop_all`: the poller then wakes the connections still parked)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.hangups.run)
            if self.poller is None:
                await trio.sleep_forever()
            else:
                await self.poller.run()

    def stop_all(self) -> None:
        """Shutdown: every connection stops reading (answers in progress are finished), and
        one that starts from now on (accepted just before the accepting stopped) does not
        read at all."""
        self._stopped = True
        for live in list(self.live):
            live.stop()

    async def watch(self) -> None:
        """Close connections past their deadline (idle, or a request sent too slowly)."""
        limits = self.limits
        period = min(WATCHDOG_PERIOD_S, limits.frame_timeout_s / 4, limits.idle_timeout_s / 4)
        while True:
            await trio.sleep(period)
            current = trio.current_time()
            for live in list(self.live):
                if live.reading and live.connection.check_deadline(current):
                    live.scope.cancel()

    async def serve(
        self, stream: socket.socket | trio.abc.Stream, info: ConnectionInfo, sasl: bool
    ) -> str:
        """Serve one connection, a plain TCP socket or a (TLS) stream, until it ends; return
        why (a metric label). Closing it is the caller's."""
        limits = self.limits
        connection = ServerConnection(
            self.controller.supported,
            sasl=sasl,
            max_frame_bytes=limits.max_frame_bytes,
            idle_timeout_s=limits.idle_timeout_s,
            frame_timeout_s=limits.frame_timeout_s,
            max_entries=self.controller.entry_limits,
            now=trio.current_time(),
        )
        # Plain TCP on its descriptor, TLS through trio's stream (socket_io.py); the
        # answers, waiting for the log, in an outbox either way (outbox.py).
        io = SocketIO(stream.fileno()) if isinstance(stream, socket.socket) else StreamIO(stream)
        outbox = self.writer.outbox(io)
        live = LiveConnection(connection, descriptor=_descriptor_of(stream))
        if self._stopped:
            live.stop()
        self.live.add(live)
        try:
            reason = "shutdown"
            with live.scope:
                reason = await self._loop(outbox, live, info)
            if live.scope.cancelled_caught:
                # Cancelled while reading: by the watchdog (a deadline) or by the shutdown.
                closed = connection.next_event()
                if isinstance(closed, ConnectionClosed):
                    log.info("closing connection", peer=info.peer, reason=closed.reason)
                    reason = closed.reason
            if reason != "broken":
                await outbox.wait_empty()  # what was decided is answered before the close
            return reason
        finally:
            self.writer.discard(outbox)
            self.live.discard(live)

    async def _loop(self, outbox: Outbox, live: LiveConnection, info: ConnectionInfo) -> str:
        connection = live.connection
        io = outbox.io
        sasl = SaslSession(connection, self.limits.sasl_mechanisms, self.credentials)
        max_in_flight = self.limits.max_in_flight
        max_unwritten = self.limits.max_unwritten_bytes
        # The poller reads descriptors: plain TCP only. A TLS connection's task awaits the
        # write of each round's answers (nothing is held: it reads nothing meanwhile).
        plain = io if isinstance(io, SocketIO) else None
        poller = self.poller if plain is not None else None
        while True:
            if plain is not None:
                if outbox.full(max_in_flight, max_unwritten):
                    # As many requests as a round takes wait for their answers, or their
                    # answers hold max_unwritten_bytes: decide and read no more until they
                    # are written (a client that does not read is muted).
                    if outbox.unwritten_bytes >= max_unwritten:
                        self.metrics.connections_muted.labels("unwritten_bytes").inc()
                    await outbox.wait_empty()
                if outbox.broken:
                    return "broken"
            decided: Round | None = None
            if not connection.has_pending_requests:
                if live.stopping:
                    return "shutdown"
                parked = poller is not None and plain is not None and self._may_park(live)
                live.reading = True
                try:
                    if parked:
                        assert poller is not None and plain is not None
                        decided = await self._park(poller, live, outbox, plain, info)
                    else:
                        self._received(connection, await io.receive_some(RECEIVE_BYTES))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return "broken"
                finally:
                    live.reading = False
                # (After the try, not in it: compiled rule 4.)
                if parked and decided is None:
                    continue  # the outbox is full or broke, or the poller stopped
            else:
                # More requests from one read than a round takes: the other connections run
                # between this one's rounds (a read would have been the wait; an answer sent
                # on a plain socket is none).
                await trio.lowlevel.checkpoint()
            room = max_in_flight - (0 if plain is None else outbox.requests)
            if decided is None:
                decided = self.rounds.decide(connection, info, room)
            info = await self._authenticate_and_go_on(connection, sasl, info, room, decided)
            answers = decided.answers
            if plain is not None:
                self._post(outbox, answers)
            elif answers.data:
                # TLS: the task awaits the outbox's write (it holds nothing meanwhile).
                data = b"".join(answers.data)
                offset = answers.durable_offset
                await self.stream_writer.write(outbox, offset, data, answers.timings)
                if outbox.broken:
                    return "broken"
            closed = decided.closed
            if closed is not None:
                if closed.reason != "client":
                    log.warning(
                        "closing connection",
                        peer=info.peer,
                        reason=closed.reason,
                        detail=closed.detail,
                    )
                return closed.reason
            # KIP-219: answer at once, then read nothing more from this client until the
            # throttle time has passed, whether or not it honours the field; a client that
            # hangs up meanwhile frees its place at once (hangups.py).
            if decided.throttle and await self.hangups.mute(live.descriptor, decided.throttle):
                return "client"

    def _may_park(self, live: LiveConnection) -> bool:
        """Whether the connection's reads may be left to the poller: authenticated (or no
        SASL), not closing, not stopping, and the poller still running."""
        return (
            live.connection.phase is Phase.READY
            and not live.stopping
            and self.poller is not None
            and not self.poller.closed
        )

    async def _park(
        self,
        poller: Poller,
        live: LiveConnection,
        outbox: Outbox,
        io: SocketIO,
        info: ConnectionInfo,
    ) -> Round | None:
        """Leave the connection's rounds to the poller until one needs this task (a SASL
        request, a throttle, the end of the connection, more requests than a round takes):
        that round, its answers not yet posted. None if the poller handed the connection
        back with nothing decided (a full or broken outbox, a shutdown, the poller's end).
        Raises ``trio.BrokenResourceError`` if a read failed."""
        connection = live.connection
        max_in_flight = self.limits.max_in_flight
        max_unwritten = self.limits.max_unwritten_bytes
        handed_back: list[Round] = []

        def read_and_decide() -> bool:
            if not self._may_park(live):
                return False  # the watchdog closed it, or the shutdown began: the task sees
            data = io.receive_now(RECEIVE_BYTES)
            if data is None:
                return True  # readable, then not
            self._received(connection, data)
            decided = self.rounds.decide(connection, info, max_in_flight - outbox.requests)
            if decided.needs_task or connection.has_pending_requests:
                handed_back.append(decided)
                return False
            self._post(outbox, decided.answers)
            return not outbox.full(max_in_flight, max_unwritten) and not outbox.broken

        await poller.park(io.fileno, read_and_decide)
        return handed_back[0] if handed_back else None

    def _received(self, connection: ServerConnection, data: bytes | bytearray) -> None:
        if data:
            self.metrics.bytes_received.inc(len(data))
        connection.receive_data(data, trio.current_time())

    def _post(self, outbox: Outbox, answers: Answers) -> None:
        parts = answers.data
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            self.writer.post(outbox, answers.durable_offset, data, answers.timings)

    async def _authenticate_and_go_on(
        self,
        connection: ServerConnection,
        sasl: SaslSession,
        info: ConnectionInfo,
        room: int,
        decided: Round,
    ) -> ConnectionInfo:
        """Answer the SASL request a round stopped at, and decide on; the connection's info
        afterwards (its principal once authenticated)."""
        while decided.sasl is not None:
            request, decided.sasl = decided.sasl, None
            received = time.perf_counter()
            api = api_name(request.api_key)
            outcome = await sasl.handle(request)
            # Account for the outcome before the answer can reach the client.
            self.accounting.count(api, request.api_version, outcome.body)
            if outcome.principal is not None:
                info = dataclasses.replace(info, principal=outcome.principal)
                log.info(
                    "authenticated",
                    peer=info.peer,
                    principal=info.principal,
                    mechanism=outcome.mechanism,
                )
            if outcome.failure is not None:
                log.warning(
                    "authentication failed",
                    peer=info.peer,
                    mechanism=outcome.mechanism,
                    reason=outcome.failure,
                )
                mechanism = outcome.mechanism or "unknown"
                self.metrics.authentication_failures.labels(mechanism).inc()
            answer = connection.send(request.header, outcome.body)
            decided.answers.add(answer, NO_WAIT, api, received)
            self.rounds.go_on(connection, info, room, decided)
        return info


def _descriptor_of(stream: socket.socket | trio.abc.Stream) -> int:
    """The descriptor of a connection's socket: a plain one's, or the one under a TLS
    stream; -1 if there is none to be had."""
    if isinstance(stream, socket.socket):
        return stream.fileno()
    transport = getattr(stream, "transport_stream", None)
    sock = getattr(transport, "socket", None)
    return sock.fileno() if sock is not None else -1
