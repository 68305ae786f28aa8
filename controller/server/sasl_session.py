"""One connection's SASL exchange: SaslHandshake (v1) then SaslAuthenticate (v0-v2).

Until it succeeds, a SASL listener serves only ApiVersions, SaslHandshake and
SaslAuthenticate; any other request closes the connection, as Kafka does. A failed
authentication is answered with SASL_AUTHENTICATION_FAILED and the connection is closed.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from pidctl.controller.server.sasl import (
    AuthenticationFailed,
    CredentialStore,
    ScramServer,
    parse_plain,
)
from pidctl.protocol.apis import ApiKey, response_class
from pidctl.protocol.codec import Request
from pidctl.protocol.server import Phase, ServerConnection


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
        mechanism = request.body.mechanism.upper()
        if self.connection.phase is not Phase.HANDSHAKE:
            return SaslOutcome(
                cls(error_code=ErrorCode.illegal_sasl_state, mechanisms=self.enabled)
            )
        if mechanism not in self.enabled:
            return SaslOutcome(
                cls(error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=self.enabled)
            )
        self.mechanism = mechanism
        self.connection.handshake_accepted()
        if mechanism != "PLAIN":
            self._scram = ScramServer(mechanism, self.credentials())
        return SaslOutcome(cls(error_code=ErrorCode.none, mechanisms=self.enabled))

    async def _authenticate(self, request: Request) -> SaslOutcome:
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
                return self._reply(request, ErrorCode.none, None, principal=f"User:{user}")
            if not self._scram_started:
                self._scram_started = True
                return self._reply(request, ErrorCode.none, None, self._scram.first(token))
            final = self._scram.final(token)
            self.connection.authenticated()
            scram_user = self._scram.user
            return self._reply(request, ErrorCode.none, None, final, principal=f"User:{scram_user}")
        except AuthenticationFailed as e:
            self.connection.authentication_failed(str(e))
            error = ErrorCode.sasl_authentication_failed
            return self._reply(request, error, str(e), failure=str(e))

    def _reply(
        self,
        request: Request,
        error: ErrorCode,
        message: str | None,
        token: bytes = b"",
        *,
        principal: str | None = None,
        failure: str | None = None,
    ) -> SaslOutcome:
        cls: Any = response_class(request.api_key, request.api_version)
        fields: dict[str, Any] = {
            "error_code": error,
            "error_message": message,
            "auth_bytes": token,
        }
        if request.api_version >= 1:
            fields["session_lifetime"] = datetime.timedelta(0)
        return SaslOutcome(cls(**fields), principal, self.mechanism, failure)
