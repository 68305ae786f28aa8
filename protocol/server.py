"""Sans-IO server connection: bytes in → requests, responses → bytes out.

The server side's counterpart of :class:`protocol.client.ClientProtocol`, in the manner of
h11's ``Connection``: the transport feeds :meth:`ServerConnection.receive_data` whatever the
socket delivered, takes events from :meth:`ServerConnection.next_event`, and writes what
:meth:`ServerConnection.send` returns. The connection knows where it is (:class:`Phase`),
what may be asked before SASL authentication, and when the client has taken too long
(:attr:`ServerConnection.deadline`, plain data the transport waits on); it never touches a
socket, a task or a clock of its own.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from kio.static.protocol import ResponsePayload

from pidctl.protocol.api_versions import unsupported_version_response
from pidctl.protocol.apis import ApiKey, SupportedApis
from pidctl.protocol.block_requests import BlockRequested, block_request_of, read_block_request
from pidctl.protocol.codec import (
    ProtocolViolation,
    Request,
    TooManyEntries,
    UnsupportedApiVersionsVersion,
    decode_request,
    encode_response,
    frame_response,
)
from pidctl.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, FrameError
from pidctl.protocol.headers import RequestHeader
from pidctl.protocol.idempotent_inits import read_idempotent_init
from pidctl.protocol.idempotent_inits import shapes as idempotent_shapes
from pidctl.protocol.init_requests import InitRequested, init_request_of, read_init_request

#: The API keys read by ``struct`` in their usual shape, as plain ints (compared per frame).
_INIT_PRODUCER_ID: Final = int(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS: Final = int(ApiKey.ALLOCATE_PRODUCER_IDS)

#: A request's correlation id, at bytes 4-8 of its frame.
_CORRELATION_ID: Final = struct.Struct(">i")

#: Kafka's ``connections.max.idle.ms`` default: 10 minutes without a request closes.
DEFAULT_IDLE_TIMEOUT_S: Final = 600.0
#: Time a client may take to send the rest of a request once it has begun (no slowloris).
DEFAULT_FRAME_TIMEOUT_S: Final = 30.0

#: What a SASL listener answers before authentication; anything else closes the connection
#: ("Unexpected Kafka request ... during SASL handshake", as Kafka), and so does a
#: SaslAuthenticate before the SaslHandshake.
ALLOWED_BEFORE_AUTHENTICATION: Final = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
)


class Phase(enum.Enum):
    """Where a connection is in its life."""

    #: A SASL listener's connection before SaslHandshake.
    HANDSHAKE = "handshake"
    #: After a SaslHandshake: SaslAuthenticate exchanges until one succeeds or fails.
    AUTHENTICATE = "authenticate"
    #: Authenticated, or on a listener without SASL: every served API.
    READY = "ready"
    #: Nothing more is read; answer what came before, then close.
    CLOSED = "closed"


class PhaseChange(NamedTuple):
    """One way a connection's :class:`Phase` changes: from, why, to (None: where it starts)."""

    source: Phase | None
    why: str
    target: Phase


#: Every change of a connection's phase, the one table the picture of its states
#: (docs/connection-states.md, drawn by ``ops/connection_states.py``) is drawn from, and
#: the tests drive a connection through (tests/protocol/test_server.py).
PHASE_CHANGES: Final = (
    PhaseChange(None, "a SASL listener's connection", Phase.HANDSHAKE),
    PhaseChange(None, "a plain or TLS listener's connection", Phase.READY),
    PhaseChange(Phase.HANDSHAKE, "SaslHandshake names an enabled mechanism", Phase.AUTHENTICATE),
    PhaseChange(Phase.AUTHENTICATE, "SaslAuthenticate succeeds", Phase.READY),
    PhaseChange(Phase.AUTHENTICATE, "SaslAuthenticate fails (answered, then closed)", Phase.CLOSED),
    PhaseChange(Phase.HANDSHAKE, "a request not allowed before authentication", Phase.CLOSED),
    PhaseChange(Phase.READY, "a protocol error, or a frame over max_frame_bytes", Phase.CLOSED),
    PhaseChange(Phase.READY, "the client closes (what it sent is answered)", Phase.CLOSED),
    PhaseChange(Phase.READY, "no request within the idle or frame timeout", Phase.CLOSED),
)


class RequestReceived(NamedTuple):
    """A decoded request for the server to answer, in order."""

    request: Request


@dataclass(frozen=True, slots=True)
class AnswerReady:
    """A request the connection answered itself (ApiVersions at an unknown version, in the
    v0 layout so the client can retry at a version listed)."""

    header: RequestHeader
    body: Any


@dataclass(frozen=True, slots=True)
class OversizedRequest:
    """A request whose array (FindCoordinator's keys, Metadata's topics) holds more than
    its API's limit: its length prefix said so, and nothing of it was decoded. The server
    answers it with the API's error from the header alone."""

    header: RequestHeader
    entries: int
    limit: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection must be closed once what came before is answered; ``reason`` is a
    short label (for logs and metrics), ``detail`` says what happened."""

    reason: str
    detail: str = ""


class IdempotentInits(NamedTuple):
    """Idempotent InitProducerId requests in a row, read without kio, for the server to
    decide as one run and answer in this order (:meth:`ServerConnection.next_event`)."""

    api_version: int
    correlation_ids: list[int]
    #: The run's first frame: its client id (``headers.client_id_in``), read only when a
    #: quota or the request log asks (they ask for runs of one: the others' may differ).
    frame: bytes


Event = (
    RequestReceived
    | IdempotentInits
    | InitRequested
    | BlockRequested
    | AnswerReady
    | OversizedRequest
    | ConnectionClosed
)


class ServerConnection:
    """One client connection's protocol state (no I/O)."""

    __slots__ = (
        "_authenticated",
        "_decoder",
        "_frame_started",
        "_frames",
        "_idempotent_shapes",
        "_init_versions",
        "_last_activity",
        "_serves_blocks",
        "closed_because",
        "frame_timeout_s",
        "idle_timeout_s",
        "max_entries",
        "phase",
        "supported",
    )

    def __init__(
        self,
        supported: SupportedApis,
        *,
        sasl: bool = False,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        frame_timeout_s: float = DEFAULT_FRAME_TIMEOUT_S,
        max_entries: Mapping[int, int] | None = None,
        now: float = 0.0,
    ) -> None:
        """``max_entries``: per API key, the most entries its array may hold
        (:data:`protocol.codec.ENTRY_ARRAYS`); a longer one is an :class:`OversizedRequest`,
        found before the array is decoded."""
        self.supported = supported
        self.max_entries = max_entries
        self.phase = Phase.HANDSHAKE if sasl else Phase.READY
        self._authenticated = not sasl
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.closed_because: ConnectionClosed | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
        self._frames: deque[bytes] = deque()
        self._frame_started: float | None = None
        self._last_activity = now
        init = supported.get(ApiKey.INIT_PRODUCER_ID)
        self._init_versions = range(0) if init is None else range(init.min, init.max + 1)
        self._idempotent_shapes = idempotent_shapes(self._init_versions)
        allocate = supported.get(ApiKey.ALLOCATE_PRODUCER_IDS)
        # (v0, the one version block_requests reads, is the only one Kafka defines.)
        self._serves_blocks = allocate is not None and allocate.min == 0

    # -- input ------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray, now: float) -> None:
        """Feed bytes the transport received at time ``now`` (any monotonic clock, seconds);
        ``b""`` means the client closed its side. Events come from :meth:`next_event`."""
        if self.phase is Phase.CLOSED:
            return
        if not data:
            # The client closed its side: what it sent before is still answered.
            self._close("client", keep_pending=True)
            return
        decoder = self._decoder
        was_in_frame = decoder.in_frame
        try:
            frames = decoder.feed(data)
        except FrameError as e:
            self._close("frame_too_large", str(e))
            return
        self._frames.extend(frames)
        self._last_activity = now
        if not decoder.in_frame:
            self._frame_started = None
        elif frames or not was_in_frame:
            self._frame_started = now  # a new frame has begun

    def next_event(self, run: int = 1) -> Event | None:
        """The next request (or answer, or closure) in arrival order; None when more bytes
        are needed. After a :class:`ConnectionClosed` there are no more events.

        One reader per API and shape: once the connection is authenticated, the hottest
        requests in their usual shape are read by ``struct``, idempotent InitProducerIds in
        a row at one version as one :class:`IdempotentInits` of at most ``run`` requests
        (:mod:`protocol.idempotent_inits`), any other InitProducerId as an
        :class:`InitRequested` (:mod:`protocol.init_requests`), an AllocateProducerIds as a
        :class:`BlockRequested` (:mod:`protocol.block_requests`); kio reads everything else,
        and hands an InitProducerId or AllocateProducerIds it read as the same
        :class:`InitRequested` or :class:`BlockRequested`. Each frame is read once (but the
        one after a run: see :meth:`_run_from`)."""
        frames = self._frames
        while frames:
            frame = frames.popleft()
            if self._authenticated and frame[:1] == b"\0":  # (every API key < 256)
                key = frame[1]
                if key == _INIT_PRODUCER_ID:
                    first = read_idempotent_init(frame, self._idempotent_shapes)
                    if first is not None:
                        return self._run_from(frame, first, max(run, 1))
                    init = read_init_request(frame, self._init_versions)
                    if init is not None:
                        return init
                elif key == _ALLOCATE_PRODUCER_IDS and self._serves_blocks:
                    block = read_block_request(frame)
                    if block is not None:
                        return block
            event = self._decode(frame)
            if isinstance(event, ConnectionClosed):
                frames.clear()
                self.phase = Phase.CLOSED
                self.closed_because = event
                break
            return event
        if self.phase is Phase.CLOSED and self.closed_because is not None:
            closed, self.closed_because = self.closed_because, None
            return closed
        return None

    def _run_from(self, frame: bytes, first: tuple[int, int], most: int) -> IdempotentInits:
        """The run ``frame`` (read as ``first``) begins: the idempotent InitProducerIds next
        in line at its version, up to ``most`` in all."""
        version, correlation_id = first
        correlation_ids = [correlation_id]
        frames, read, served = self._frames, read_idempotent_init, self._idempotent_shapes
        # A client sends the same request again but for its correlation id (bytes 4-8): a
        # frame equal to the first elsewhere is read, as the first was, by comparing it.
        head, tail = frame[:4], frame[8:]
        while frames and len(correlation_ids) < most:
            following = frames[0]
            if following[8:] == tail and following[:4] == head:
                correlation_ids.append(_CORRELATION_ID.unpack_from(following, 4)[0])
            else:
                read_following = read(following, served)
                if read_following is None or read_following[0] != version:
                    break  # (next_event reads it again: the one frame read twice)
                correlation_ids.append(read_following[1])
            frames.popleft()
        return IdempotentInits(version, correlation_ids, frame)

    @property
    def has_pending_requests(self) -> bool:
        """Whole frames received and not yet returned as events."""
        return bool(self._frames)

    def _decode(self, frame: bytes) -> Event:
        try:
            request = decode_request(frame, self.supported, self.max_entries)
        # (A name per clause: compiled rule 3.)
        except UnsupportedApiVersionsVersion as unsupported:
            return AnswerReady(unsupported.header, unsupported_version_response(self.supported))
        except TooManyEntries as too_many:
            if not self._authenticated:
                return ConnectionClosed(
                    "unauthenticated_request",
                    f"API key {too_many.header.api_key} before SASL authentication",
                )
            return OversizedRequest(too_many.header, too_many.entries, too_many.limit)
        except ProtocolViolation as violation:
            return ConnectionClosed("protocol_error", str(violation))
        if not self._authenticated:
            if request.api_key not in ALLOWED_BEFORE_AUTHENTICATION:
                return ConnectionClosed(
                    "unauthenticated_request",
                    f"API key {request.api_key} before SASL authentication",
                )
            if request.api_key == ApiKey.SASL_AUTHENTICATE and self.phase is Phase.HANDSHAKE:
                # Kafka takes only ApiVersions and SaslHandshake before the handshake: a
                # token is no Kafka request there, and closes without an answer.
                return ConnectionClosed(
                    "unauthenticated_request", "SaslAuthenticate before SaslHandshake"
                )
        api_key = request.api_key
        if api_key == _INIT_PRODUCER_ID:
            return init_request_of(request)
        if api_key == _ALLOCATE_PRODUCER_IDS:
            return block_request_of(request)
        return RequestReceived(request)

    # -- output -----------------------------------------------------------------------------

    def send(self, header: RequestHeader, body: ResponsePayload) -> bytes:
        """The bytes of the response to the request with ``header``."""
        return encode_response(header, body)

    def send_encoded(self, header: RequestHeader, body: ResponsePayload, encoded: bytes) -> bytes:
        """:meth:`send` for a body encoded ahead (``encoded``, its
        :func:`~pidctl.protocol.codec.encode_response_body`): only the header is packed."""
        return frame_response(header, body, encoded)

    # -- SASL -------------------------------------------------------------------------------

    def handshake_accepted(self) -> None:
        """A SaslHandshake named an enabled mechanism: SaslAuthenticate comes next."""
        if self.phase is Phase.HANDSHAKE:
            self.phase = Phase.AUTHENTICATE

    def authenticated(self) -> None:
        """A SaslAuthenticate succeeded: every API from now on."""
        self._authenticated = True
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.READY

    def authentication_failed(self, detail: str) -> None:
        """A SaslAuthenticate failed: answer it, then close."""
        self._close("authentication_failed", detail)

    # -- time -------------------------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """When the client has taken too long: the frame deadline while a request is half
        received, else the idle deadline."""
        if self._frame_started is not None:
            return self._frame_started + self.frame_timeout_s
        return self._last_activity + self.idle_timeout_s

    def check_deadline(self, now: float) -> bool:
        """Close (``frame_timeout`` or ``idle``) if ``now`` is past :attr:`deadline`; True if
        it did."""
        if self.phase is Phase.CLOSED or now < self.deadline:
            return False
        reason = "frame_timeout" if self._frame_started is not None else "idle"
        self._close(
            reason, f"no {'whole request' if reason == 'frame_timeout' else 'request'} in time"
        )
        return True

    def _close(self, reason: str, detail: str = "", *, keep_pending: bool = False) -> None:
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
            self.closed_because = ConnectionClosed(reason, detail)
            if not keep_pending:
                self._frames.clear()
