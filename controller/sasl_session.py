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

from protocol.apis import ApiKey, response_class
from protocol.codec import Request

from .sasl import AuthenticationFailed, CredentialStore, ScramServer, parse_plain

#: Requests a SASL listener answers before authentication.
ALLOWED_BEFORE_AUTHENTICATION = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
)


@dataclass(frozen=True, slots=True)
class SaslOutcome:
    body: Any
    #: Set once authenticated: the principal the connection now acts as.
    principal: str | None = None
    #: Close the connection after sending ``body`` (failed authentication).
    close: bool = False
    #: Mechanism and failure reason, for the log and metrics (never the password).
    mechanism: str | None = None
    failure: str | None = None


class SaslSession:
    def __init__(
        self, enabled: tuple[str, ...], credentials: Callable[[], CredentialStore], active: bool
    ) -> None:
        self.enabled = enabled
        self.credentials = credentials
        self.state = "handshake" if active else "none"
        self.mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._scram_started = False

    @property
    def authenticated(self) -> bool:
        return self.state in ("done", "none")

    async def handle(self, request: Request) -> SaslOutcome:
        if request.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(request)
        return await self._authenticate(request)

    def _handshake(self, request: Request) -> SaslOutcome:
        cls: Any = response_class(request.api_key, request.api_version)
        mechanism = request.body.mechanism.upper()
        if self.state != "handshake":
            return SaslOutcome(cls(error_code=ErrorCode.illegal_sasl_state,
                                   mechanisms=self.enabled))  # fmt: skip
        if mechanism not in self.enabled:
            return SaslOutcome(cls(error_code=ErrorCode.unsupported_sasl_mechanism,
                                   mechanisms=self.enabled))  # fmt: skip
        self.mechanism = mechanism
        self.state = "authenticate"
        if mechanism != "PLAIN":
            self._scram = ScramServer(mechanism, self.credentials())
        return SaslOutcome(cls(error_code=ErrorCode.none, mechanisms=self.enabled))

    async def _authenticate(self, request: Request) -> SaslOutcome:
        if self.state != "authenticate":
            return self._reply(request, ErrorCode.illegal_sasl_state, "SASL handshake first",
                               close=True)  # fmt: skip
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
                self.state = "done"
                return self._reply(request, ErrorCode.none, None, principal=f"User:{user}")
            if not self._scram_started:
                self._scram_started = True
                return self._reply(request, ErrorCode.none, None, self._scram.first(token))
            final = self._scram.final(token)
            self.state = "done"
            scram_user = self._scram.user
            return self._reply(request, ErrorCode.none, None, final,
                               principal=f"User:{scram_user}")  # fmt: skip
        except AuthenticationFailed as e:
            self.state = "failed"
            return self._reply(request, ErrorCode.sasl_authentication_failed, str(e), close=True,
                               failure=str(e))  # fmt: skip

    def _reply(
        self, request: Request, error: ErrorCode, message: str | None, token: bytes = b"",
        *, principal: str | None = None, close: bool = False, failure: str | None = None,
    ) -> SaslOutcome:  # fmt: skip
        cls: Any = response_class(request.api_key, request.api_version)
        fields: dict[str, Any] = {"error_code": error, "error_message": message,
                                  "auth_bytes": token}  # fmt: skip
        if request.api_version >= 1:
            fields["session_lifetime"] = datetime.timedelta(0)
        return SaslOutcome(cls(**fields), principal, close, self.mechanism, failure)
