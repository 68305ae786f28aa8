"""One connection's SASL exchange: SaslHandshake (v1) then SaslAuthenticate (v0-v2).

Until it succeeds, a SASL listener serves only ApiVersions, SaslHandshake and
SaslAuthenticate; any other request closes the connection, as Kafka does. As Kafka's
``SaslServerAuthenticator``, whatever ends the exchange unsuccessfully is answered and then
closes the connection: a mechanism not enabled (UNSUPPORTED_SASL_MECHANISM; names compared
exactly, case included), a SaslHandshake during the exchange (ILLEGAL_SASL_STATE), a failed
authentication (SASL_AUTHENTICATION_FAILED). Once authenticated (and on a listener without
SASL) both requests are answered as Kafka's ``KafkaApis`` answers them: ILLEGAL_SASL_STATE,
and the connection stays.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from pidctl.controller.server.security.sasl import (
    AuthenticationFailed,
    CredentialStore,
    ScramServer,
    parse_plain,
)
from pidctl.protocol.apis import ApiKey, response_class
from pidctl.protocol.codec import Request
from pidctl.protocol.server import Phase, ServerConnection

#: KafkaApis' answer to a SaslAuthenticate once the connection is authenticated.
AUTHENTICATED_ALREADY = "SaslAuthenticate request received after successful authentication"
#: How much of a mechanism name no one enabled the log shows (the client chose it).
MECHANISM_LOGGED = 64


@dataclass(frozen=True, slots=True)
class SaslOutcome:
    body: Any
    #: Set once authenticated: the principal the connection now acts as.
    principal: str | None = None
    #: Mechanism and failure reason, for the log and metrics (never the password).
    mechanism: str | None = None
    failure: str | None = None


class SaslSession:
    """The mechanism and SCRAM exchange of one connection; the connection's :class:`Phase`
    says where the exchange is, and this moves it on."""

    def __init__(
        self,
        connection: ServerConnection,
        enabled: tuple[str, ...],
        credentials: Callable[[], CredentialStore],
    ) -> None:
        self.connection = connection
        self.enabled = enabled
        self.credentials = credentials
        self.mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._scram_started = False

    async def handle(self, request: Request) -> SaslOutcome:
        if request.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(request)
        return await self._authenticate(request)

    def _handshake(self, request: Request) -> SaslOutcome:
        cls: Any = response_class(request.api_key, request.api_version)
        mechanism: str = request.body.mechanism
        phase = self.connection.phase
        if phase is Phase.AUTHENTICATE:
            # During the exchange Kafka expects SaslAuthenticate alone: anything else is
            # answered with its error response (a handshake's lists no mechanisms) and closes.
            reason = "Unexpected Kafka request of type SASL_HANDSHAKE during SASL authentication"
            return self._refused_handshake(cls, ErrorCode.illegal_sasl_state, (), reason)
        if phase is not Phase.HANDSHAKE:
            # Past the exchange the request reaches Kafka's KafkaApis: ILLEGAL_SASL_STATE,
            # no mechanisms, and the connection stays (or goes on closing).
            return SaslOutcome(cls(error_code=ErrorCode.illegal_sasl_state, mechanisms=()))
        if mechanism not in self.enabled:  # exactly: Kafka's enabledMechanisms.contains
            reason = f"Unsupported SASL mechanism {mechanism[:MECHANISM_LOGGED]!r}"
            return self._refused_handshake(
                cls, ErrorCode.unsupported_sasl_mechanism, self.enabled, reason
            )
        self.mechanism = mechanism
        self.connection.handshake_accepted()
        if mechanism != "PLAIN":
            self._scram = ScramServer(mechanism, self.credentials())
        return SaslOutcome(cls(error_code=ErrorCode.none, mechanisms=self.enabled))

    def _refused_handshake(
        self, cls: Any, error: ErrorCode, mechanisms: tuple[str, ...], reason: str
    ) -> SaslOutcome:
        """Answer ``error``, then close: the authentication has failed."""
        self.connection.authentication_failed(reason)
        body = cls(error_code=error, mechanisms=mechanisms)
        return SaslOutcome(body, mechanism=self.mechanism, failure=reason)

    async def _authenticate(self, request: Request) -> SaslOutcome:
        if self.connection.phase is Phase.READY:
            # As KafkaApis: authenticated already (or no SASL here); the connection stays.
            return self._reply(request, ErrorCode.illegal_sasl_state, AUTHENTICATED_ALREADY)
        if self.connection.phase is not Phase.AUTHENTICATE:
            self.connection.authentication_failed("SaslAuthenticate before SaslHandshake")
            return self._reply(request, ErrorCode.illegal_sasl_state, "SASL handshake first")
        token: bytes = request.body.auth_bytes
        try:
            if self._scram is None:
                user, password = parse_plain(token)
                store = self.credentials()
                # PBKDF2 takes milliseconds: off the event loop.
                if not await trio.to_thread.run_sync(store.check_password, user, password):
                    raise AuthenticationFailed(
                        "Authentication failed: invalid username or password"
                    )
                self.connection.authenticated()
                return self._reply(request, ErrorCode.none, "", principal=f"User:{user}")
            if not self._scram_started:
                self._scram_started = True
                return self._reply(request, ErrorCode.none, "", self._scram.first(token))
            final = self._scram.final(token)
            self.connection.authenticated()
            scram_user = self._scram.user
            return self._reply(request, ErrorCode.none, "", final, principal=f"User:{scram_user}")
        except AuthenticationFailed as e:
            self.connection.authentication_failed(str(e))
            error = ErrorCode.sasl_authentication_failed
            return self._reply(request, error, str(e), failure=str(e))

    def _reply(
        self,
        request: Request,
        error: ErrorCode,
        message: str,
        token: bytes = b"",
        *,
        principal: str | None = None,
        failure: str | None = None,
    ) -> SaslOutcome:
        """``message``: "" when there is no error, as Kafka sends it (its message's default;
        the schema's "null if there was no error" is not what goes on the wire)."""
        cls: Any = response_class(request.api_key, request.api_version)
        fields: dict[str, Any] = {
            "error_code": error,
            "error_message": message,
            "auth_bytes": token,
        }
        if request.api_version >= 1:
            fields["session_lifetime"] = datetime.timedelta(0)
        return SaslOutcome(cls(**fields), principal, self.mechanism, failure)
