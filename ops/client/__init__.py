"""Thin I/O shells over :class:`protocol.client.ClientProtocol`: a blocking socket client and
a trio client. Used by the CLI, the tests, the broker library and the Spark hook."""

from __future__ import annotations

import socket
import ssl
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kio.static.protocol import RequestPayload

from pidctl.protocol import requests
from pidctl.protocol.addresses import HostPort
from pidctl.protocol.client import ClientProtocol
from pidctl.protocol.sasl_client import ScramClient, plain_token

if TYPE_CHECKING:  # imported where used: a Spark task's blocking client needs no trio
    import trio

_RECEIVE_BYTES = 64 * 1024
#: Buffers one ``sendmsg`` takes at most (well under Linux's IOV_MAX of 1024).
_IOV_MAX = 512


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """``HOST:PORT`` to a (host, port) pair."""
    try:
        address = HostPort.parse(bootstrap)
    except ValueError:
        raise ValueError(f"bootstrap must be HOST:PORT, got {bootstrap!r}") from None
    return address.host, address.port


class AuthenticationError(Exception):
    """The server refused the SASL handshake or authentication."""


class SyncClient:
    """A blocking Kafka-protocol client over one TCP (or TLS) connection."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str | None = "pidctl",
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        sasl: tuple[str, str, str] | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> None:
        """Connect to ``bootstrap`` (``HOST:PORT``); ``timeout`` bounds every socket wait.

        ``ssl_context`` makes it a TLS connection; ``sasl`` = (mechanism, user, password)
        authenticates with PLAIN or SCRAM-SHA-256/512 first (raises AuthenticationError);
        ``source_address`` (host, port) is the local address to connect from (port 0: any)."""
        host, port = parse_bootstrap(bootstrap)
        sock = socket.create_connection(
            (host, port), timeout=timeout, source_address=source_address
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=host)
        self._sock = sock
        self._protocol = ClientProtocol(client_id)
        self._received: deque[Any] = deque()
        if sasl is not None:
            try:
                self._authenticate(*sasl)
            except BaseException:
                self.close()
                raise

    def _authenticate(self, mechanism: str, user: str, password: str) -> None:
        handshake = self.request(requests.sasl_handshake(mechanism))
        if handshake.error_code:
            raise AuthenticationError(f"SASL handshake refused: {handshake.error_code.name}")
        if mechanism == "PLAIN":
            self._sasl_step(plain_token(user, password))
            return
        scram = ScramClient(mechanism, user, password)
        server_first = self._sasl_step(scram.first())
        if not scram.verify(self._sasl_step(scram.final(server_first))):
            raise AuthenticationError("the server's SCRAM signature does not verify")

    def _sasl_step(self, token: bytes) -> bytes:
        try:
            response = self.request(requests.sasl_authenticate(token))
        except ConnectionError as e:
            raise AuthenticationError(f"connection closed during SASL: {e}") from e
        if response.error_code:
            raise AuthenticationError(response.error_message or response.error_code.name)
        return bytes(response.auth_bytes)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def request(self, body: RequestPayload) -> Any:
        """Send one request and return its response entity."""
        return self.pipeline([body])[0]

    def pipeline(
        self, bodies: Sequence[RequestPayload], client_ids: Sequence[str] | None = None
    ) -> list[Any]:
        """Send all requests at once, then return their responses in order; ``client_ids``
        (one per request) replace the connection's client id in their headers."""
        if client_ids is None:
            data = b"".join(self._protocol.send(body)[1] for body in bodies)
        else:
            sent = zip(bodies, client_ids, strict=True)
            data = b"".join(self._protocol.send(body, client_id)[1] for body, client_id in sent)
        self._sock.sendall(data)
        return [self.receive() for _ in bodies]

    @property
    def outstanding(self) -> int:
        """Requests sent whose responses have not been returned by :meth:`receive` yet."""
        return self._protocol.outstanding + len(self._received)

    def send(self, body: RequestPayload) -> None:
        """Send one request without waiting for its response (:meth:`receive` returns the
        responses in the order of the requests): a producer keeps several in flight."""
        self._sock.sendall(self._protocol.send(body)[1])

    def send_parts(self, api_key: int, api_version: int, body: Sequence[Any]) -> None:
        """Send one request whose body the caller encoded, in ``body``'s parts (bytes-like:
        a record batch goes from its own buffer, not copied into one frame); its response
        is read by :meth:`receive` as any other."""
        size = sum(memoryview(part).nbytes for part in body)
        _, prefix = self._protocol.send_prefix(api_key, api_version, size)
        parts = [prefix, *body]
        if isinstance(self._sock, ssl.SSLSocket):  # TLS has no sendmsg
            self._sock.sendall(b"".join(parts))
            return
        views = [memoryview(part).cast("B") for part in parts]
        while views:
            sent = self._sock.sendmsg(views[:_IOV_MAX])
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]

    def receive(self) -> Any:
        """The response to the oldest request sent and not yet received (waits for it)."""
        while not self._received:
            chunk = self._sock.recv(_RECEIVE_BYTES)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self._received.extend(r for _, r in self._protocol.receive(chunk))
        return self._received.popleft()


class TrioClient:
    """A trio Kafka-protocol client over one TCP connection."""

    def __init__(self, stream: trio.SocketStream, client_id: str | None = "pidctl") -> None:
        """Wrap an open stream; use :meth:`connect` to open one."""
        self._stream = stream
        self._protocol = ClientProtocol(client_id)
        import trio

        self._lock = trio.Lock()

    @classmethod
    async def connect(cls, bootstrap: str, *, client_id: str | None = "pidctl") -> TrioClient:
        """Open a connection to ``bootstrap`` (``HOST:PORT``)."""
        host, port = parse_bootstrap(bootstrap)
        import trio

        return cls(await trio.open_tcp_stream(host, port), client_id)

    async def aclose(self) -> None:
        """Close the connection."""
        await self._stream.aclose()

    async def __aenter__(self) -> TrioClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(self, body: RequestPayload) -> Any:
        """Send one request and return its response entity."""
        return (await self.pipeline([body]))[0]

    async def pipeline(self, bodies: Sequence[RequestPayload]) -> list[Any]:
        """Send all requests at once, then return their responses in order."""
        async with self._lock:
            await self._stream.send_all(b"".join(self._protocol.send(b)[1] for b in bodies))
            responses: list[Any] = []
            while len(responses) < len(bodies):
                chunk = await self._stream.receive_some(_RECEIVE_BYTES)
                if not chunk:
                    raise ConnectionError("connection closed by the server")
                responses.extend(r for _, r in self._protocol.receive(chunk))
            return responses
