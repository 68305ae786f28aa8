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
import datetime
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio
from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.init_producer_id import IdempotentRun, InitAnswer
from pidctl.controller.api.quorum import Now
from pidctl.controller.api.responses import NO_WAIT, QUOTA_REFUSALS
from pidctl.controller.core.producer_ids import Block
from pidctl.controller.core.quotas import Quotas, quota_subject
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.server.security.sasl_session import SaslSession
from pidctl.controller.server.telemetry.metrics import Metrics, api_name
from pidctl.controller.server.transport.hangups import Hangups
from pidctl.controller.server.transport.outbox import (
    Durability,
    Outbox,
    SocketWriter,
    StreamWriter,
    Timings,
)
from pidctl.controller.server.transport.poller import Poller
from pidctl.controller.server.transport.socket_io import SocketIO, StreamIO
from pidctl.controller.settings import DEFAULT_MAX_ENTRIES_PER_ROUND, DEFAULT_MAX_UNWRITTEN_BYTES
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.block_requests import BlockRequested
from pidctl.protocol.codec import (
    Request,
    allocate_producer_ids_answer,
    encode_response,
    frame_response,
    init_producer_id_answer,
)
from pidctl.protocol.headers import client_id_in
from pidctl.protocol.idempotent_inits import answer_run
from pidctl.protocol.init_requests import InitRequested
from pidctl.protocol.server import (
    AnswerReady,
    ConnectionClosed,
    IdempotentInits,
    OversizedRequest,
    Phase,
    RequestReceived,
    ServerConnection,
)

log = structlog.get_logger("pidctl.server")

#: Bytes asked of the socket per read. Requests are small; 64 KiB takes many pipelined ones
#: in one system call without holding much memory per connection.
RECEIVE_BYTES = 64 * 1024
#: How often the watchdog looks at the connections' deadlines at most; a deadline is met
#: within this (or a quarter of the shortest timeout, whichever is less).
WATCHDOG_PERIOD_S = 1.0

_SASL_APIS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
_INIT_PRODUCER_ID = api_name(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS = api_name(ApiKey.ALLOCATE_PRODUCER_IDS)
_INIT_PRODUCER_ID_KEY = int(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS_KEY = int(ApiKey.ALLOCATE_PRODUCER_IDS)
#: The answers of requests a strict quota refuses undecided (api/responses.py says why
#: these errors): an InitProducerId's, alone or a run of one, and an AllocateProducerIds'.
_OVER_QUOTA_INIT = InitAnswer(QUOTA_REFUSALS[ApiKey.INIT_PRODUCER_ID])
_OVER_QUOTA_RUN = IdempotentRun((), QUOTA_REFUSALS[ApiKey.INIT_PRODUCER_ID], NO_WAIT)
_OVER_QUOTA_BLOCK = Block(QUOTA_REFUSALS[ApiKey.ALLOCATE_PRODUCER_IDS], 0, 0)


def now() -> Now:
    return Now(time.time_ns() // 1_000_000, time.monotonic_ns() // 1_000_000)


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
        log: Durability,
        quotas: Quotas,
        metrics: Metrics,
        credentials: Callable[[], CredentialStore],
        limits: ConnectionLimits,
        *,
        log_requests: bool = False,
        poller: Poller | None = None,
    ) -> None:
        """``poller``: runs the rounds of idle plain-TCP connections (see poller.py) once
        :meth:`poll` runs; None (where there is no epoll, say) and every connection reads in
        its own task."""
        self.controller = controller
        self.log = log
        self.quotas = quotas
        self.metrics = metrics
        self.credentials = credentials
        self.limits = limits
        # Decided once: building the request log's fields costs on every request otherwise.
        self.log_requests = log_requests
        self.live: set[LiveConnection] = set()
        self._stopped = False
        # Metric children, resolved once: labels() costs a lock and a dict lookup per call.
        self._answered: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}
        self._created: dict[str, Any] = {}  # pidctl_producer_ids_created_total by principal
        #: The writers, one per transport: plain TCP's (what the purgatory releases after
        #: each commit), TLS's (awaited by the connection's task).
        self.writer = SocketWriter(log, self._sent)
        self.stream_writer = StreamWriter(log, self._sent)
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
            decided: _Round | None = None
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
                decided = self._decide(connection, info, room)
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

    @property
    def _one_at_a_time(self) -> bool:
        """Whether each request must be accounted for alone (a request or producer-id quota
        throttles at the one that crosses it; the request log has a line each): then the
        idempotent runs are one request long. The readers and answerers are the same."""
        quotas = self.quotas
        return quotas.limits_requests or quotas.limits_producer_ids or self.log_requests

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
    ) -> _Round | None:
        """Leave the connection's rounds to the poller until one needs this task (a SASL
        request, a throttle, the end of the connection, more requests than a round takes):
        that round, its answers not yet posted. None if the poller handed the connection
        back with nothing decided (a full or broken outbox, a shutdown, the poller's end).
        Raises ``trio.BrokenResourceError`` if a read failed."""
        connection = live.connection
        max_in_flight = self.limits.max_in_flight
        max_unwritten = self.limits.max_unwritten_bytes
        handed_back: list[_Round] = []

        def read_and_decide() -> bool:
            if not self._may_park(live):
                return False  # the watchdog closed it, or the shutdown began: the task sees
            data = io.receive_now(RECEIVE_BYTES)
            if data is None:
                return True  # readable, then not
            self._received(connection, data)
            decided = self._decide(connection, info, max_in_flight - outbox.requests)
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

    def _post(self, outbox: Outbox, answers: _Answers) -> None:
        parts = answers.data
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            self.writer.post(outbox, answers.durable_offset, data, answers.timings)

    def _decide(self, connection: ServerConnection, info: ConnectionInfo, room: int) -> _Round:
        """Decide up to ``room`` requests received so far, in order: see :meth:`_go_on`."""
        decided = _Round(_Answers())
        self._go_on(connection, info, room, decided)
        return decided

    def _go_on(
        self, connection: ServerConnection, info: ConnectionInfo, room: int, decided: _Round
    ) -> None:
        """Decide more requests into ``decided``, until it holds ``room`` answers or has
        spent the round's budget of entries (``max_entries_per_round``: the rest waits for
        the next round, after the other connections'); stop early at a SASL request (left for
        :meth:`_authenticate_and_go_on`: the exchange awaits), the connection's end, or a
        throttle. Each kind of request has one answerer (:data:`_ANSWERERS`) whatever the
        settings: a quota or the request log only makes the idempotent runs one long."""
        answers = decided.answers
        budget = self.limits.max_entries_per_round
        one_at_a_time = self._one_at_a_time
        # The requests of one round are decided at one time (and received at one).
        decided_at: Now | None = None
        received = 0.0
        while len(answers.data) < room and decided.work < budget:
            event = connection.next_event(
                1 if one_at_a_time else min(room - len(answers.data), budget - decided.work)
            )
            answerer = _ANSWERERS.get(type(event))
            if answerer is not None:  # (a request is what comes, nearly always)
                if decided_at is None:
                    decided_at, received = now(), time.perf_counter()
                decided.work += answerer(self, event, decided_at, info, decided, received)
                if decided.throttle or decided.sasl is not None:
                    # Muted (the rest waits until the throttle time has passed), or a SASL
                    # request for _authenticate_and_go_on (the exchange awaits).
                    return
                continue
            if event is None:
                break
            if isinstance(event, ConnectionClosed):
                decided.closed = event
                return
            decided.work += 1
            if isinstance(event, AnswerReady):
                self._count("api_versions", event.header.api_version, event.body)
                answers.data.append(connection.send(event.header, event.body))
                continue
            assert isinstance(event, OversizedRequest)
            header = event.header
            body = self.controller.refuse_oversized(header, event.entries, event.limit).body
            self._count(api_name(header.api_key), header.api_version, body)
            answers.data.append(connection.send(header, body))
        if connection.phase is Phase.CLOSED and not connection.has_pending_requests:
            event = connection.next_event()
            decided.closed = event if isinstance(event, ConnectionClosed) else None

    # -- one answerer per kind of request (what protocol/server.py's readers yield) --------

    def _answer_request(
        self,
        event: RequestReceived,
        decided_at: Now,
        info: ConnectionInfo,
        decided: _Round,
        received: float,
    ) -> int:
        """Decide and answer a request kio read, of an API without a value of its own (not
        InitProducerId or AllocateProducerIds): the controller's :meth:`Controller.handle`.
        The entries it counts for in the round's budget."""
        request = event.request
        if request.api_key in _SASL_APIS:
            decided.sasl = request
            return 1
        header = request.header
        api = api_name(request.api_key)
        # Unpacked at once: one step, where each field read by name is a lookup.
        body, durable_offset, encoded = self.controller.handle(request, decided_at, info)
        # (No API answered here takes a quota: none refuses it.)
        client_id = header.client_id
        delay = self._accounted(
            api,
            header.api_version,
            getattr(body, "error_code", 0),
            0,
            0.0,
            request.api_key,
            client_id,
            client_id,
            header.correlation_id,
            info,
        )
        if delay:
            millis = datetime.timedelta(milliseconds=round(delay * 1000))
            data = encode_response(header, dataclasses.replace(body, throttle_time=millis))
        elif encoded is None:
            data = encode_response(header, body)
        else:  # (ApiVersions: its body encoded once, by controller/api/responses.py)
            data = frame_response(header, body, encoded)
        decided.answers.add(data, durable_offset, api, received)
        decided.throttle = delay
        return 1 + request.entries

    def _answer_init(
        self,
        request: InitRequested,
        decided_at: Now,
        info: ConnectionInfo,
        decided: _Round,
        received: float,
    ) -> int:
        """Decide and answer an InitProducerId (read by ``struct`` or kio; not an idempotent
        run's): :meth:`InitProducerIdHandler.init_producer_id`, unless its quota refuses it
        first."""
        version, correlation_id = request.api_version, request.correlation_id
        client_id = request.client_id
        refused = self._refusal(_INIT_PRODUCER_ID, _INIT_PRODUCER_ID_KEY, client_id, True, info)
        if refused:
            answer = _OVER_QUOTA_INIT
        else:
            answer = self.controller.inits.init_producer_id(request, decided_at, info)
        error = answer.error
        delay = self._accounted(
            _INIT_PRODUCER_ID,
            version,
            error,
            answer.created,
            refused,
            _INIT_PRODUCER_ID_KEY,
            client_id,
            client_id,
            correlation_id,
            info,
        )
        data = init_producer_id_answer(
            version,
            correlation_id,
            error,
            answer.producer_id,
            answer.producer_epoch,
            round(delay * 1000) if delay else 0,
        )
        decided.answers.add(data, answer.durable_offset, _INIT_PRODUCER_ID, received)
        decided.throttle = delay
        return 1

    def _answer_run(
        self,
        run: IdempotentInits,
        decided_at: Now,
        info: ConnectionInfo,
        decided: _Round,
        received: float,
    ) -> int:
        """Decide and answer a run of idempotent InitProducerIds (one version, their
        correlation ids in order): :meth:`InitProducerIdHandler.init_idempotent_run`. A run
        of one (every run while a quota or the request log needs each request alone)
        is refused and accounted for as :meth:`_answer_init` does one; how many requests."""
        version, correlation_ids, frame = run
        count = len(correlation_ids)
        if count == 1:
            correlation_id = correlation_ids[0]
            # Read only for what asks for it (a quota, the request log).
            client_id = client_id_in(frame) if self._one_at_a_time else None
            refused = self._refusal(_INIT_PRODUCER_ID, _INIT_PRODUCER_ID_KEY, client_id, True, info)
            if refused:
                pids, error, offset = _OVER_QUOTA_RUN
            else:
                pids, error, offset = self.controller.inits.init_idempotent_run(1, decided_at, info)
            granted = len(pids)
            delay = self._accounted(
                _INIT_PRODUCER_ID,
                version,
                0 if granted else error,
                granted,
                refused,
                _INIT_PRODUCER_ID_KEY,
                client_id,
                client_id,
                correlation_id,
                info,
            )
            throttle_ms = round(delay * 1000) if delay else 0
            if granted:
                data = init_producer_id_answer(version, correlation_id, 0, pids[0], 0, throttle_ms)
            else:
                data = init_producer_id_answer(version, correlation_id, error, -1, -1, throttle_ms)
            decided.answers.add(data, offset, _INIT_PRODUCER_ID, received)
            decided.throttle = delay
            return 1
        # (Longer runs only without a quota or the request log: counted, never throttled.)
        pids, error, offset = self.controller.inits.init_idempotent_run(count, decided_at, info)
        granted = len(pids)
        if granted < count:
            self._tally(_INIT_PRODUCER_ID, version, error, count - granted)
        self._tally(_INIT_PRODUCER_ID, version, 0, granted)
        if granted:
            self._new_producer_ids(info.principal, granted)
        decided.answers.add_run(
            answer_run(version, correlation_ids, pids, error), offset, _INIT_PRODUCER_ID, received
        )
        return count

    def _answer_block(
        self,
        request: BlockRequested,
        decided_at: Now,
        info: ConnectionInfo,
        decided: _Round,
        received: float,
    ) -> int:
        """Decide and answer an AllocateProducerIds (read by ``struct`` or kio):
        :meth:`AllocateProducerIdsHandler.allocate_producer_ids`, unless its quota refuses
        it first."""
        client_id, correlation_id = request.client_id, request.correlation_id
        subject, creates = quota_subject(_ALLOCATE_PRODUCER_IDS_KEY, client_id, request)
        refused = self._refusal(
            _ALLOCATE_PRODUCER_IDS, _ALLOCATE_PRODUCER_IDS_KEY, subject, creates, info
        )
        if refused:
            block, offset, created = _OVER_QUOTA_BLOCK, NO_WAIT, 0
        else:
            block, offset, created = self.controller.allocations.allocate_producer_ids(
                request, decided_at, info
            )
        error = block.error
        delay = self._accounted(
            _ALLOCATE_PRODUCER_IDS,
            0,
            error,
            created,
            refused,
            _ALLOCATE_PRODUCER_IDS_KEY,
            subject,
            client_id,
            correlation_id,
            info,
        )
        throttle_ms = round(delay * 1000) if delay else 0
        data = allocate_producer_ids_answer(
            correlation_id, error, block.first, block.length, throttle_ms
        )
        decided.answers.add(data, offset, _ALLOCATE_PRODUCER_IDS, received)
        decided.throttle = delay
        return 1

    def _refusal(
        self,
        api: str,
        api_key: int,
        subject: str | None,
        creates_producer_ids: bool,
        info: ConnectionInfo,
    ) -> float:
        """Before a request of an API that takes a quota is decided: 0 if it may be; else
        the throttle of its refusal (strict quotas, ``core/quotas.py``: its bucket is
        behind, whichever connection or client id it came by), counted. ``subject``: the
        client id its request quota counts it under (``quota_subject``)."""
        quotas = self.quotas
        if not (quotas.limits_requests or quotas.limits_producer_ids):
            return 0.0
        refused = quotas.refusal(
            api_key, info.principal, subject, creates_producer_ids, time.monotonic()
        )
        if refused:
            self.metrics.quota_refusals.labels(api).inc()
        return refused

    def _accounted(
        self,
        api: str,
        version: int,
        error: int,
        created: int,
        refused: float,
        api_key: int,
        subject: str | None,
        client_id: str | None,
        correlation_id: int,
        info: ConnectionInfo,
    ) -> float:
        """What follows the decision of one request, whichever its API: the throttle its
        quotas ask for (KIP-219; 0 for none), counted; the answer counted; the request log's
        line. ``created``: the producer ids it created (for their quota); ``refused``: the
        throttle of a quota's refusal (:meth:`_refusal`: nothing was decided, nothing more
        is counted against the quotas); ``subject``: the client id its request quota counts
        it under (``quota_subject``), ``client_id`` the one it sent."""
        delay = refused
        if not refused:
            quotas = self.quotas
            if quotas.limits_requests:
                delay = quotas.request(api_key, info.principal, subject, time.monotonic())
            if created:
                delay = max(delay, self._new_producer_ids(info.principal, created))
        if delay:
            self._throttled(api, delay)
        self._tally(api, version, error, 1)
        if self.log_requests:
            log.debug(
                "request",
                api=api,
                version=version,
                peer=info.peer,
                client_id=client_id,
                correlation_id=correlation_id,
                error=error,
            )
        return delay

    async def _authenticate_and_go_on(
        self,
        connection: ServerConnection,
        sasl: SaslSession,
        info: ConnectionInfo,
        room: int,
        decided: _Round,
    ) -> ConnectionInfo:
        """Answer the SASL request a round stopped at, and decide on; the connection's info
        afterwards (its principal once authenticated)."""
        while decided.sasl is not None:
            request, decided.sasl = decided.sasl, None
            received = time.perf_counter()
            api = api_name(request.api_key)
            outcome = await sasl.handle(request)
            # Account for the outcome before the answer can reach the client.
            self._count(api, request.api_version, outcome.body)
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
            self._go_on(connection, info, room, decided)
        return info

    def _sent(self, size: int, timings: Timings) -> None:
        self.metrics.bytes_sent.inc(size)
        if timings:
            sent = time.perf_counter()
            # The answers of one round share their API and receipt (a run's, one timing):
            # each such stretch is observed at once.
            count, last = 0, timings[0]
            for timing in timings:
                if timing is last or timing == last:
                    count += 1
                    continue
                self._latency_of(last[0]).observe(sent - last[1], count)
                count, last = 1, timing
            self._latency_of(last[0]).observe(sent - last[1], count)

    def _new_producer_ids(self, principal: str, count: int) -> float:
        """Count producer ids created for ``principal``; the throttle their quota asks for
        (``producer_ids_rate``), or 0."""
        child = self._created.get(principal)
        if child is None:
            child = self._created[principal] = self.metrics.producer_ids_created.labels(principal)
        child.inc(count)
        if not self.quotas.limits_producer_ids:
            return 0.0
        delay = self.quotas.producer_ids(principal, count, time.monotonic())
        if delay:
            self.metrics.producer_ids_throttled.labels(principal).inc()
            self.metrics.producer_ids_throttle_seconds.labels(principal).inc(delay)
        return delay

    def _throttled(self, api: str, seconds: float) -> None:
        self.metrics.throttled.labels(api).inc()
        self.metrics.throttle_seconds.labels(api).inc(seconds)

    def _latency_of(self, api: str) -> Any:
        child = self._latency.get(api)
        if child is None:
            child = self._latency[api] = self.metrics.latency.labels(api)
        return child

    def _count(self, api: str, version: int, body: object) -> None:
        self._tally(api, version, getattr(body, "error_code", 0), 1)

    def _tally(self, api: str, version: int, error: int, count: int) -> None:
        """Count ``count`` answers of ``api`` at ``version``, all with ``error``."""
        child = self._answered.get((api, version))
        if child is None:
            child = self._answered[api, version] = self.metrics.requests.labels(api, str(version))
        child.inc(count)
        if error:
            name = ErrorCode(error).name.upper()
            self.metrics.errors.labels(api, str(version), name).inc(count)


def _descriptor_of(stream: socket.socket | trio.abc.Stream) -> int:
    """The descriptor of a connection's socket: a plain one's, or the one under a TLS
    stream; -1 if there is none to be had."""
    if isinstance(stream, socket.socket):
        return stream.fileno()
    transport = getattr(stream, "transport_stream", None)
    sock = getattr(transport, "socket", None)
    return sock.fileno() if sock is not None else -1


# _Round and _Answers: plain classes, one of each made per round (compiled rule 1).
class _Round:
    """What deciding the requests received so far gave, and why it stopped early."""

    def __init__(self, answers: _Answers) -> None:
        self.answers = answers
        self.closed: ConnectionClosed | None = None
        self.throttle = 0.0
        #: Entries decided so far (a request without an array counts 1): the round's budget.
        self.work = 0
        #: A SASL request, for the connection's task to answer (the exchange awaits).
        self.sasl: Request | None = None

    @property
    def needs_task(self) -> bool:
        """Whether what comes next needs the connection's own task."""
        return self.closed is not None or self.throttle > 0 or self.sasl is not None


class _Answers:
    """Encoded answers of one round, and the log offset they wait for."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.durable_offset = NO_WAIT
        self.timings: list[tuple[str, float]] = []

    def add(self, data: bytes, durable_offset: int, api: str, received: float) -> None:
        self.data.append(data)
        self.durable_offset = max(self.durable_offset, durable_offset)
        self.timings.append((api, received))

    def add_run(self, data: list[bytes], durable_offset: int, api: str, received: float) -> None:
        """:meth:`add` for the answers of one run, all received at one time."""
        self.data += data
        self.durable_offset = max(self.durable_offset, durable_offset)
        self.timings += [(api, received)] * len(data)


#: The requests ``protocol/server.py``'s readers yield, and the one answerer of each kind
#: (whichever reader read it, whatever the settings).
_ANSWERERS: dict[type, Callable[..., int]] = {
    RequestReceived: ConnectionTasks._answer_request,
    IdempotentInits: ConnectionTasks._answer_run,
    InitRequested: ConnectionTasks._answer_init,
    BlockRequested: ConnectionTasks._answer_block,
}
