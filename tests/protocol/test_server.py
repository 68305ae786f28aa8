"""The sans-IO server connection: bytes in, events out, without a socket or a clock."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.api_versions.v0 import ApiVersionsResponse as ApiVersionsResponseV0

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, supported_apis
from pidctl.protocol.block_requests import BlockRequested
from pidctl.protocol.codec import decode_request, encode_request
from pidctl.protocol.framing import FrameDecoder
from pidctl.protocol.init_requests import InitRequested
from pidctl.protocol.server import (
    PHASE_CHANGES,
    AnswerReady,
    ConnectionClosed,
    Event,
    IdempotentInits,
    OversizedRequest,
    Phase,
    PhaseChange,
    RequestReceived,
    ServerConnection,
)

SUPPORTED = supported_apis(SERVED_APIS)


def _connection(**options: object) -> ServerConnection:
    return ServerConnection(SUPPORTED, **options)  # type: ignore[arg-type]


def _events(connection: ServerConnection, run: int = 1) -> list[Event]:
    events = []
    while (event := connection.next_event(run)) is not None:
        events.append(event)
    return events


def _phase(connection: ServerConnection) -> Phase:
    return connection.phase


def _frame(body: object, correlation_id: int = 1) -> bytes:
    return encode_request(body, correlation_id, "test")  # type: ignore[arg-type]


def test_requests_split_across_reads_and_pipelined_in_one_read() -> None:
    connection = _connection()
    data = _frame(requests.metadata(), 1) + _frame(requests.api_versions(), 2)
    connection.receive_data(data[:7], now=0.0)
    assert _events(connection) == []
    connection.receive_data(data[7:], now=0.1)
    events = _events(connection)
    assert [type(e) for e in events] == [RequestReceived, RequestReceived]
    first, second = (e.request for e in events if isinstance(e, RequestReceived))
    assert (first.api_key, first.header.correlation_id) == (ApiKey.METADATA, 1)
    assert (second.api_key, second.header.correlation_id) == (ApiKey.API_VERSIONS, 2)


def test_idempotent_inits_in_a_row_come_as_runs_of_at_most_run_at_one_version() -> None:
    idempotent = requests.init_producer_id(None)
    transactional = requests.init_producer_id("tx")
    frames = [
        _frame(idempotent, 1),
        _frame(idempotent, 2),
        _frame(idempotent, 3),
        _frame(transactional, 4),
        _frame(idempotent, 5),
        _frame(requests.init_producer_id(None, version=2), 6),
        _frame(requests.api_versions(), 7),
    ]
    connection = _connection()
    connection.receive_data(b"".join(frames), now=0.0)
    events = _events(connection, run=2)
    version = 5  # requests.init_producer_id's default
    assert events[:2] == [
        IdempotentInits(version, [1, 2], frames[0][4:]),
        IdempotentInits(version, [3], frames[2][4:]),
    ]
    assert events[2] == InitRequested(version, 4, "test", "tx", 60_000, -1, -1)
    assert events[3:5] == [
        IdempotentInits(version, [5], frames[4][4:]),
        IdempotentInits(2, [6], frames[5][4:]),
    ]
    assert isinstance(events[5], RequestReceived)
    assert events[5].request.api_key == ApiKey.API_VERSIONS
    assert len(events) == 6


def test_an_allocate_producer_ids_comes_as_one_value_whichever_reader_read_it() -> None:
    """Read by struct in its usual shape, by kio with a tagged field in its header: the
    same :class:`BlockRequested` either way."""
    usual = _frame(requests.allocate(3, 9), 1)
    # A flexible header's tagged fields: one field (tag 5, one byte) where none was.
    client_end = 4 + 10 + len("test")
    tagged = usual[:client_end] + b"\x01\x05\x01\x00" + usual[client_end + 1 :]
    tagged = struct.pack(">i", len(tagged) - 4) + tagged[4:]
    connection = _connection()
    connection.receive_data(usual + _frame(requests.metadata(), 2) + tagged, now=0.0)
    first, second, third = _events(connection)
    assert first == BlockRequested(1, "test", 3, 9)
    assert isinstance(second, RequestReceived) and second.request.api_key == ApiKey.METADATA
    assert third == BlockRequested(1, "test", 3, 9)
    # A connection that does not serve the API refuses it (kio: an unknown API).
    not_served = ServerConnection(supported_apis({ApiKey.API_VERSIONS: (0, 4)}))
    not_served.receive_data(usual, now=0.0)
    assert isinstance(not_served.next_event(), ConnectionClosed)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, None, None, "tx"]),
            st.sampled_from([5, 5, 3, 0]),
            st.sampled_from([60_000, 60_000, -1]),
            st.sampled_from(["c", "c", "other"]),
        ),
        max_size=12,
    ),
    st.integers(1, 5),
)
def test_runs_hold_the_idempotent_inits_kio_reads_in_order(
    shapes: list[tuple[str | None, int, int, str]], run: int
) -> None:
    """Whatever the mix (versions, timeouts, client ids, a transactional id between), the
    runs hold exactly the idempotent requests kio reads, in order, each run at one version
    and no longer than ``run``."""
    data = b"".join(
        encode_request(requests.init_producer_id(tid, timeout, version=v), i, client)
        for i, (tid, v, timeout, client) in enumerate(shapes)
    )
    by_runs = _connection()
    by_runs.receive_data(data, now=0.0)
    by_kio = [decode_request(frame, SUPPORTED) for frame in FrameDecoder().feed(data)]
    expected = [
        (request.api_version, request.header.correlation_id)
        for request in by_kio
        if request.body.transactional_id is None
    ]
    runs = [e for e in _events(by_runs, run) if isinstance(e, IdempotentInits)]
    assert all(1 <= len(r.correlation_ids) <= run for r in runs)
    assert [(r.api_version, c) for r in runs for c in r.correlation_ids] == expected


def test_runs_of_one_and_nothing_read_by_struct_before_authentication() -> None:
    data = _frame(requests.init_producer_id(None), 1) + _frame(requests.init_producer_id(None), 2)
    connection = _connection()
    connection.receive_data(data, now=0.0)
    assert _events(connection, run=1) == [
        IdempotentInits(5, [1], data[4 : len(data) // 2]),
        IdempotentInits(5, [2], data[4 + len(data) // 2 :]),
    ]
    connection = _connection(sasl=True)
    connection.receive_data(data, now=0.0)
    assert _events(connection, run=8) == [
        ConnectionClosed("unauthenticated_request", "API key 22 before SASL authentication")
    ]


def test_a_frame_over_the_limit_closes_before_its_body_arrives() -> None:
    connection = _connection(max_frame_bytes=100)
    connection.receive_data(struct.pack(">i", 101), now=0.0)
    assert _events(connection) == [
        ConnectionClosed("frame_too_large", "frame of 101 bytes exceeds max_frame_bytes=100")
    ]
    assert connection.phase is Phase.CLOSED
    connection.receive_data(b"more", now=0.1)  # ignored once closed
    assert _events(connection) == []


def test_unknown_api_closes_after_answering_what_came_before() -> None:
    connection = _connection()
    bogus = struct.pack(">hhi", 999, 0, 7) + b"\xff\xff"
    data = _frame(requests.api_versions()) + struct.pack(">i", len(bogus)) + bogus
    connection.receive_data(data + _frame(requests.api_versions(), 3), now=0.0)
    events = _events(connection)
    assert isinstance(events[0], RequestReceived)
    assert isinstance(events[1], ConnectionClosed) and events[1].reason == "protocol_error"
    assert len(events) == 2  # the request after the bad frame is dropped


def test_api_versions_at_an_unknown_version_is_answered_in_the_v0_layout() -> None:
    connection = _connection()
    # A flexible (v2) request header: a null client id, then no tagged fields.
    header = struct.pack(">hhih", ApiKey.API_VERSIONS, 99, 5, -1) + b"\0"
    connection.receive_data(struct.pack(">i", len(header)) + header, now=0.0)
    (event,) = _events(connection)
    assert isinstance(event, AnswerReady)
    assert isinstance(event.body, ApiVersionsResponseV0)
    assert event.body.error_code == 35  # UNSUPPORTED_VERSION
    encoded = connection.send(event.header, event.body)
    assert struct.unpack_from(">ii", encoded) == (len(encoded) - 4, 5)


def test_sasl_listener_serves_only_the_handshake_apis_before_authentication() -> None:
    connection = _connection(sasl=True)
    assert connection.phase is Phase.HANDSHAKE
    connection.receive_data(_frame(requests.api_versions()), now=0.0)
    assert isinstance(connection.next_event(), RequestReceived)
    connection.receive_data(_frame(requests.metadata()), now=0.0)
    assert _events(connection) == [
        ConnectionClosed("unauthenticated_request", "API key 3 before SASL authentication")
    ]


def test_a_token_before_the_handshake_closes_unanswered() -> None:
    """As Kafka: before SaslHandshake only ApiVersions and SaslHandshake are Kafka requests;
    a SaslAuthenticate closes the connection. After the handshake it is the exchange."""
    connection = _connection(sasl=True)
    connection.receive_data(_frame(requests.sasl_authenticate(b"\0alice\0secret")), now=0.0)
    assert _events(connection) == [
        ConnectionClosed("unauthenticated_request", "SaslAuthenticate before SaslHandshake")
    ]
    connection = _connection(sasl=True)
    connection.receive_data(_frame(requests.sasl_handshake("PLAIN")), now=0.0)
    assert isinstance(connection.next_event(), RequestReceived)
    connection.handshake_accepted()
    connection.receive_data(_frame(requests.sasl_authenticate(b"\0alice\0secret")), now=0.0)
    assert isinstance(connection.next_event(), RequestReceived)


def test_after_authentication_every_api() -> None:
    connection = _connection(sasl=True)
    connection.handshake_accepted()
    assert _phase(connection) is Phase.AUTHENTICATE
    connection.authenticated()
    assert _phase(connection) is Phase.READY
    connection.receive_data(_frame(requests.metadata()), now=0.0)
    assert isinstance(connection.next_event(), RequestReceived)


def test_failed_authentication_closes() -> None:
    connection = _connection(sasl=True)
    connection.handshake_accepted()
    connection.authentication_failed("bad password")
    assert _events(connection) == [ConnectionClosed("authentication_failed", "bad password")]


def test_client_close_still_answers_what_it_sent_before() -> None:
    connection = _connection()
    connection.receive_data(_frame(requests.api_versions()), now=0.0)
    connection.receive_data(b"", now=0.1)
    events = _events(connection)
    assert isinstance(events[0], RequestReceived)
    assert events[1] == ConnectionClosed("client")


def test_unauthenticated_request_then_close_is_not_served() -> None:
    connection = _connection(sasl=True)
    connection.receive_data(_frame(requests.metadata()), now=0.0)
    connection.receive_data(b"", now=0.0)
    (event,) = _events(connection)
    assert isinstance(event, ConnectionClosed) and event.reason == "unauthenticated_request"


def test_idle_deadline_moves_with_each_request() -> None:
    connection = _connection(idle_timeout_s=10.0, now=0.0)
    assert connection.deadline == 10.0
    connection.receive_data(_frame(requests.api_versions()), now=4.0)
    assert connection.deadline == 14.0
    assert not connection.check_deadline(13.9)
    assert connection.check_deadline(14.0)
    assert _events(connection)[-1] == ConnectionClosed("idle", "no request in time")


def test_frame_deadline_counts_from_the_start_of_the_frame() -> None:
    connection = _connection(idle_timeout_s=600.0, frame_timeout_s=2.0, now=0.0)
    data = _frame(requests.api_versions())
    connection.receive_data(data[:3], now=1.0)
    connection.receive_data(data[3:5], now=2.5)  # more of the same frame: no new deadline
    assert connection.deadline == 3.0
    assert connection.check_deadline(3.0)
    assert connection.next_event() == ConnectionClosed("frame_timeout", "no whole request in time")


def _metadata_v0_claiming(entries: int) -> bytes:
    """A Metadata v0 request whose topics' length prefix claims ``entries`` and no topic
    follows: a request that cannot be decoded, whose array is still counted."""
    frame = _frame(requests.metadata([], version=0))
    body = frame[4:-4] + struct.pack(">i", entries)  # v0's body is the topics array alone
    return struct.pack(">i", len(body)) + body


def test_an_array_over_its_limit_is_refused_before_it_is_decoded() -> None:
    limits = {ApiKey.METADATA: 10, ApiKey.FIND_COORDINATOR: 3}
    connection = _connection(max_entries=limits)
    # The length prefix claims 2**31-1 topics and no topic follows: were it decoded, it
    # would fail as malformed; counted first, it is an OversizedRequest.
    connection.receive_data(_metadata_v0_claiming(2**31 - 1), now=0.0)
    events = _events(connection)
    assert len(events) == 1 and isinstance(events[0], OversizedRequest), events
    assert (events[0].entries, events[0].limit) == (2**31 - 1, 10)
    assert events[0].header.api_key == ApiKey.METADATA
    keys = requests.find_coordinator("a", version=4)
    over = type(keys)(key_type=keys.key_type, coordinator_keys=("a", "b", "c", "d"))
    within = type(keys)(key_type=keys.key_type, coordinator_keys=("a", "b", "c"))
    connection.receive_data(_frame(over, 2) + _frame(within, 3), now=0.1)
    refused, served = _events(connection)
    assert isinstance(refused, OversizedRequest) and refused.entries == 4
    assert isinstance(served, RequestReceived) and served.request.entries == 3
    assert connection.phase is Phase.READY  # answered, not closed


def test_arrays_are_not_limited_without_limits() -> None:
    connection = _connection()
    connection.receive_data(_frame(requests.metadata(["a"] * 50, version=4)), now=0.0)
    (event,) = _events(connection)
    assert isinstance(event, RequestReceived) and event.request.entries == 50


def test_an_oversized_request_before_authentication_closes() -> None:
    connection = _connection(sasl=True, max_entries={ApiKey.METADATA: 1})
    connection.receive_data(_frame(requests.metadata(["a", "b"], version=4)), now=0.0)
    (event,) = _events(connection)
    assert isinstance(event, ConnectionClosed) and event.reason == "unauthenticated_request"


def _drive(change: PhaseChange) -> ServerConnection:
    """A connection taken through ``change`` (from its source phase)."""
    sasl = change.source in (Phase.HANDSHAKE, Phase.AUTHENTICATE) or change.target in (
        Phase.HANDSHAKE,
        Phase.AUTHENTICATE,
    )
    connection = _connection(sasl=sasl, max_frame_bytes=1000, idle_timeout_s=10.0)
    if change.source is None:
        return connection
    if change.source is Phase.AUTHENTICATE:
        connection.handshake_accepted()
    assert connection.phase is change.source
    why = change.why
    if why.startswith("SaslHandshake"):
        connection.handshake_accepted()
    elif why.startswith("SaslAuthenticate succeeds"):
        connection.authenticated()
    elif why.startswith("SaslAuthenticate fails"):
        connection.authentication_failed("bad password")
    elif why.startswith("a request not allowed"):
        connection.receive_data(_frame(requests.metadata()), now=0.0)
        _events(connection)
    elif why.startswith("a protocol error"):
        connection.receive_data(struct.pack(">i", 1001), now=0.0)
    elif why.startswith("the client closes"):
        connection.receive_data(b"", now=0.0)
    elif why.startswith("no request within"):
        assert connection.check_deadline(11.0)
    else:
        raise AssertionError(f"no way to drive: {why}")
    return connection


@pytest.mark.parametrize("change", PHASE_CHANGES, ids=lambda c: c.why)
def test_every_phase_change_of_the_table_is_how_a_connection_changes(change: PhaseChange) -> None:
    """The table the picture is drawn from (docs/connection-states.md) is what a connection
    does: each row driven on a real ServerConnection."""
    assert _drive(change).phase is change.target
