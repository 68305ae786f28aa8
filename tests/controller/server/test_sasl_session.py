"""One connection's SASL exchange (sasl_session.py), driven as the connection task drives it:
real SaslHandshake and SaslAuthenticate requests decoded from their bytes, the connection's
sans-IO state beside it, pidctl's own SCRAM client on the other side. PLAIN and SCRAM
succeed with the right password and name the principal; a wrong password, a mechanism not
enabled and an exchange out of order are answered with Kafka's error codes, and those Kafka
closes on close the connection."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.controller.server.sasl import SCRAM_MECHANISMS, CredentialStore, ScramCredential
from pidctl.controller.server.sasl_session import SaslOutcome, SaslSession
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, request_class, supported_apis
from pidctl.protocol.codec import Request, decode_request, encode_request
from pidctl.protocol.sasl_client import ScramClient, plain_token
from pidctl.protocol.server import ConnectionClosed, Phase, ServerConnection

SUPPORTED = supported_apis(SERVED_APIS)
ENABLED = ("PLAIN", "SCRAM-SHA-256")
INVALID = "Authentication failed: invalid username or password"


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


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"])
async def test_a_mechanism_not_enabled_is_refused_naming_those_that_are(
    session: SaslSession, connection: ServerConnection, mechanism: str
) -> None:
    outcome = await session.handle(handshake(mechanism))
    assert outcome.body.error_code == ErrorCode.unsupported_sasl_mechanism
    assert tuple(outcome.body.mechanisms) == ENABLED
    assert session.mechanism is None and outcome.principal is None
    assert phase(connection) is not Phase.READY
    # No exchange began: a token now is out of order.
    refused = await session.handle(authenticate(plain_token("alice", "wonderland")))
    assert_refused(refused, connection, ErrorCode.illegal_sasl_state)


async def test_saslauthenticate_before_the_handshake_is_illegal_and_closes(
    session: SaslSession, connection: ServerConnection
) -> None:
    outcome = await session.handle(authenticate(plain_token("alice", "wonderland")))
    assert_refused(outcome, connection, ErrorCode.illegal_sasl_state)
    assert outcome.body.error_message == "SASL handshake first"


async def test_a_second_handshake_is_illegal(
    session: SaslSession, connection: ServerConnection
) -> None:
    await _accepted(session, "PLAIN")
    again = await session.handle(handshake("SCRAM-SHA-256"))
    assert again.body.error_code == ErrorCode.illegal_sasl_state
    assert session.mechanism == "PLAIN"  # the exchange begun is not switched


async def test_a_handshake_after_authentication_is_illegal_and_the_connection_stays(
    session: SaslSession, connection: ServerConnection
) -> None:
    """As Kafka's KafkaApis answers it: ILLEGAL_SASL_STATE, nothing else happens."""
    await _accepted(session, "PLAIN")
    await session.handle(authenticate(plain_token("alice", "wonderland")))
    again = await session.handle(handshake("PLAIN"))
    assert again.body.error_code == ErrorCode.illegal_sasl_state
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
