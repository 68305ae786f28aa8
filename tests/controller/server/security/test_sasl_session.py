"""One connection's SASL exchange (sasl_session.py), driven as the connection task drives it:
real SaslHandshake and SaslAuthenticate requests decoded from their bytes, the connection's
sans-IO state beside it, pidctl's own SCRAM client on the other side. PLAIN and SCRAM
succeed with the right password and name the principal; a wrong password, a mechanism not
enabled and an exchange out of order are answered with Kafka's error codes, and those Kafka
closes on close the connection (its SaslServerAuthenticator's choices); once authenticated,
or without SASL, both requests are answered as Kafka's KafkaApis answers them."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.controller.server.security.sasl import (
    SCRAM_MECHANISMS,
    CredentialStore,
    ScramCredential,
)
from pidctl.controller.server.security.sasl_session import (
    MECHANISM_LOGGED,
    SaslOutcome,
    SaslSession,
)
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, request_class, supported_apis
from pidctl.protocol.codec import Request, decode_request, encode_request
from pidctl.protocol.sasl_client import ScramClient, plain_token
from pidctl.protocol.server import ConnectionClosed, Phase, ServerConnection

SUPPORTED = supported_apis(SERVED_APIS)
ENABLED = ("PLAIN", "SCRAM-SHA-256")
INVALID = "Authentication failed: invalid username or password"
#: KafkaApis' message for a SaslAuthenticate on an authenticated connection.
AFTER_SUCCESS = "SaslAuthenticate request received after successful authentication"


@pytest.fixture
def store() -> CredentialStore:
    return CredentialStore(
        {"alice": {m: ScramCredential.create("wonderland", m) for m in SCRAM_MECHANISMS}}
    )


@pytest.fixture
def connection() -> ServerConnection:
    return ServerConnection(SUPPORTED, sasl=True)


@pytest.fixture
def session(connection: ServerConnection, store: CredentialStore) -> SaslSession:
    return SaslSession(connection, ENABLED, lambda: store)


def _request(body: Any) -> Request:
    return decode_request(encode_request(body, 1, "test")[4:], SUPPORTED)


def handshake(mechanism: str) -> Request:
    return _request(requests.sasl_handshake(mechanism))


def authenticate(token: bytes, version: int = 2) -> Request:
    cls: Any = request_class(ApiKey.SASL_AUTHENTICATE, version)
    return _request(cls(auth_bytes=token))


def phase(connection: ServerConnection) -> Phase:
    return connection.phase  # (a call: mypy would keep what an earlier assert narrowed)


def closed_because(connection: ServerConnection) -> str | None:
    """Why the connection closes once its answers are out (None: it stays open)."""
    event = connection.next_event()
    return event.reason if isinstance(event, ConnectionClosed) else None


def assert_refused(
    outcome: SaslOutcome,
    connection: ServerConnection,
    error: ErrorCode = ErrorCode.sasl_authentication_failed,
) -> None:
    """Answered ``error``, nobody authenticated, and the connection closes after it."""
    assert outcome.body.error_code == error
    assert outcome.principal is None
    assert closed_because(connection) == "authentication_failed"


async def _accepted(session: SaslSession, mechanism: str) -> SaslOutcome:
    outcome = await session.handle(handshake(mechanism))
    assert outcome.body.error_code == ErrorCode.none
    assert tuple(outcome.body.mechanisms) == ENABLED
    return outcome


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_plain_authenticates_and_names_the_principal(
    session: SaslSession, connection: ServerConnection, version: int
) -> None:
    await _accepted(session, "PLAIN")
    assert phase(connection) is Phase.AUTHENTICATE
    outcome = await session.handle(authenticate(plain_token("alice", "wonderland"), version))
    assert outcome.body.error_code == ErrorCode.none and outcome.body.auth_bytes == b""
    assert outcome.body.error_message == ""  # as Kafka: empty, not null
    assert (outcome.principal, outcome.mechanism, outcome.failure) == ("User:alice", "PLAIN", None)
    assert phase(connection) is Phase.READY
    # v1 added the session lifetime (KIP-368): 0, no re-authentication asked for.
    if version >= 1:
        assert outcome.body.session_lifetime == datetime.timedelta(0)
    else:
        assert not hasattr(outcome.body, "session_lifetime")


@pytest.mark.parametrize("mechanism", sorted(SCRAM_MECHANISMS))
async def test_scram_authenticates_and_proves_the_server_knows_the_credentials(
    connection: ServerConnection, store: CredentialStore, mechanism: str
) -> None:
    session = SaslSession(connection, ("PLAIN", *SCRAM_MECHANISMS), lambda: store)
    await session.handle(handshake(mechanism))
    client = ScramClient(mechanism, "alice", "wonderland")
    first = await session.handle(authenticate(client.first()))
    assert first.body.error_code == ErrorCode.none and first.principal is None
    assert phase(connection) is Phase.AUTHENTICATE  # one message more
    final = await session.handle(authenticate(client.final(first.body.auth_bytes)))
    assert final.body.error_code == ErrorCode.none
    assert first.body.error_message == final.body.error_message == ""  # as Kafka
    assert client.verify(final.body.auth_bytes)
    assert (final.principal, final.mechanism) == ("User:alice", mechanism)
    assert phase(connection) is Phase.READY


@pytest.mark.parametrize(
    ("user", "password"), [("alice", "not-the-password"), ("mallory", "wonderland")]
)
async def test_plain_with_a_wrong_password_or_user_is_refused_and_closes(
    session: SaslSession, connection: ServerConnection, user: str, password: str
) -> None:
    await _accepted(session, "PLAIN")
    outcome = await session.handle(authenticate(plain_token(user, password)))
    assert_refused(outcome, connection)
    assert outcome.body.error_message == INVALID
    assert (outcome.mechanism, outcome.failure) == ("PLAIN", INVALID)


async def test_scram_with_a_wrong_password_is_refused_at_the_proof_and_closes(
    session: SaslSession, connection: ServerConnection
) -> None:
    await _accepted(session, "SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", "not-the-password")
    first = await session.handle(authenticate(client.first()))
    assert first.body.error_code == ErrorCode.none  # the salt is no secret
    final = await session.handle(authenticate(client.final(first.body.auth_bytes)))
    assert_refused(final, connection)
    assert final.body.error_message == INVALID


async def test_scram_for_an_unknown_user_is_refused_at_once_and_closes(
    session: SaslSession, connection: ServerConnection
) -> None:
    await _accepted(session, "SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "mallory", "wonderland")
    outcome = await session.handle(authenticate(client.first()))
    assert_refused(outcome, connection)
    assert outcome.body.error_message == INVALID


@pytest.mark.parametrize(
    "mechanism",
    [
        "SCRAM-SHA-512",
        "GSSAPI",
        "OAUTHBEARER",
        # Compared exactly, as Kafka's enabledMechanisms.contains(clientMechanism) does.
        "plain",
        "Plain",
        "scram-sha-256",
    ],
)
async def test_a_mechanism_not_enabled_is_refused_naming_those_that_are_and_closes(
    session: SaslSession, connection: ServerConnection, mechanism: str
) -> None:
    """As Kafka's SaslServerAuthenticator: UNSUPPORTED_SASL_MECHANISM with the enabled
    mechanisms, then the connection closes (an authentication failure)."""
    outcome = await session.handle(handshake(mechanism))
    assert_refused(outcome, connection, ErrorCode.unsupported_sasl_mechanism)
    assert tuple(outcome.body.mechanisms) == ENABLED
    assert session.mechanism is None
    assert (outcome.mechanism, outcome.failure) == (
        None,
        f"Unsupported SASL mechanism {mechanism!r}",
    )


async def test_a_mechanism_name_the_log_shows_is_bounded(
    session: SaslSession, connection: ServerConnection
) -> None:
    outcome = await session.handle(handshake("X" * 30_000))
    assert_refused(outcome, connection, ErrorCode.unsupported_sasl_mechanism)
    assert outcome.failure == f"Unsupported SASL mechanism {'X' * MECHANISM_LOGGED!r}"


async def test_a_token_no_handshake_began_is_refused_and_closes(
    session: SaslSession, connection: ServerConnection
) -> None:
    """The session's own guard: the connection closes on a SaslAuthenticate before the
    handshake without passing it on (tests/protocol/test_server.py), but one decided after
    the client closed its side (the phase lost) still authenticates no one."""
    outcome = await session.handle(authenticate(plain_token("alice", "wonderland")))
    assert_refused(outcome, connection, ErrorCode.illegal_sasl_state)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_a_second_handshake_is_illegal_and_closes(
    session: SaslSession, connection: ServerConnection, mechanism: str
) -> None:
    """During the exchange Kafka's SaslServerAuthenticator takes SaslAuthenticate alone:
    the handshake gets its error response (ILLEGAL_SASL_STATE, no mechanisms), then the
    connection closes."""
    await _accepted(session, "PLAIN")
    again = await session.handle(handshake(mechanism))
    assert_refused(again, connection, ErrorCode.illegal_sasl_state)
    assert tuple(again.body.mechanisms) == ()
    assert session.mechanism == "PLAIN"  # the exchange begun is not switched
    assert (again.mechanism, again.failure) == (
        "PLAIN",
        "Unexpected Kafka request of type SASL_HANDSHAKE during SASL authentication",
    )


async def _authenticated(session: SaslSession) -> None:
    await _accepted(session, "PLAIN")
    outcome = await session.handle(authenticate(plain_token("alice", "wonderland")))
    assert outcome.principal == "User:alice"


async def test_a_handshake_after_authentication_is_illegal_and_the_connection_stays(
    session: SaslSession, connection: ServerConnection
) -> None:
    """As Kafka's KafkaApis answers it: ILLEGAL_SASL_STATE, no mechanisms, nothing else
    happens."""
    await _authenticated(session)
    again = await session.handle(handshake("PLAIN"))
    assert again.body.error_code == ErrorCode.illegal_sasl_state
    assert tuple(again.body.mechanisms) == ()
    assert (again.principal, again.failure) == (None, None)
    assert phase(connection) is Phase.READY and closed_because(connection) is None


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_saslauthenticate_after_authentication_is_illegal_and_the_connection_stays(
    session: SaslSession, connection: ServerConnection, version: int
) -> None:
    """As Kafka's KafkaApis answers it: ILLEGAL_SASL_STATE with its message; the token is
    not looked at (a wrong password fails nothing), the principal stays."""
    await _authenticated(session)
    for token in (plain_token("alice", "wonderland"), plain_token("alice", "wrong"), b""):
        again = await session.handle(authenticate(token, version))
        assert again.body.error_code == ErrorCode.illegal_sasl_state
        assert again.body.error_message == AFTER_SUCCESS
        assert again.body.auth_bytes == b""
        assert (again.principal, again.failure) == (None, None)
    assert phase(connection) is Phase.READY and closed_because(connection) is None


async def test_without_sasl_on_the_listener_both_are_illegal_and_the_connection_stays(
    store: CredentialStore,
) -> None:
    """A PLAINTEXT listener's connection is where an authenticated one is: Kafka's
    KafkaApis answers both requests, and nothing else happens."""
    connection = ServerConnection(SUPPORTED)
    session = SaslSession(connection, ENABLED, lambda: store)
    shake = await session.handle(handshake("PLAIN"))
    assert (shake.body.error_code, tuple(shake.body.mechanisms)) == (
        ErrorCode.illegal_sasl_state,
        (),
    )
    token = await session.handle(authenticate(plain_token("alice", "wonderland")))
    assert token.body.error_code == ErrorCode.illegal_sasl_state
    assert token.body.error_message == AFTER_SUCCESS
    assert token.principal is None
    assert phase(connection) is Phase.READY and closed_because(connection) is None


@pytest.mark.parametrize(
    "token",
    [
        b"alice\0wonderland",  # PLAIN without its first NUL
        b"\0\0wonderland",  # no user
        b"bob\0alice\0wonderland",  # acting for someone else
    ],
)
async def test_malformed_plain_is_refused_and_closes(
    session: SaslSession, connection: ServerConnection, token: bytes
) -> None:
    await _accepted(session, "PLAIN")
    assert_refused(await session.handle(authenticate(token)), connection)


async def test_scram_messages_out_of_order_are_refused_and_close(
    session: SaslSession, connection: ServerConnection
) -> None:
    """A client-final message first (a replayed proof) is not a client-first message."""
    await _accepted(session, "SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", "wonderland")
    server_first = b"r=" + client.first().split(b"r=")[1] + b"xyz,s=c2FsdA==,i=4096"
    assert_refused(await session.handle(authenticate(client.final(server_first))), connection)


async def test_the_credentials_in_force_when_the_password_is_checked_are_used(
    connection: ServerConnection,
) -> None:
    """A reload (SIGHUP) between the handshake and the token counts: the store is asked
    when it is needed, not kept from the connection's start."""
    stores = [CredentialStore()]
    session = SaslSession(connection, ENABLED, lambda: stores[-1])
    await session.handle(handshake("PLAIN"))
    reloaded = ScramCredential.create("new", "SCRAM-SHA-256")
    stores.append(CredentialStore({"alice": {"SCRAM-SHA-256": reloaded}}))
    outcome = await session.handle(authenticate(plain_token("alice", "new")))
    assert outcome.principal == "User:alice"
