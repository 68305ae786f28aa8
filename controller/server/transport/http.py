"""/metrics, /healthz and /readyz, served on the event loop.

No thread of its own: a scrape is a few milliseconds of the loop every few seconds, where a
server thread would compete with the request path for the GIL all the time. A minimal
HTTP/1.1 responder (one request per connection, ``Connection: close``) is all Prometheus and
a container's health check need.

A flood of connections cannot keep the health probes out. At most ``max_connections`` are
open at once (they count in the process's descriptor budget), but a connection that comes
while they are all open is accepted all the same, and the one that has waited longest for
its request head is closed to make room (or, if every one has sent its request, the oldest):
a probe sends its request as it connects, so it is answered within a pass of the loop,
however many connections a client holds open without sending anything. A connection has
``request_timeout_s`` (``metrics_request_timeout_ms``) to send its request head, and
``CONNECTION_TIMEOUT_S`` in all.
"""

from __future__ import annotations

import contextlib
import errno
from typing import Final

import structlog
import trio
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.admission import (
    ACCEPT_CAPACITY_ERRNOS,
    ACCEPT_RETRY_S,
    open_listeners,
)
from pidctl.protocol.addresses import HostPort

#: Bytes of a request head read at most; a scrape sends a few hundred.
MAX_REQUEST_HEAD_BYTES: Final = 8192
#: Default of ``metrics_request_timeout_ms``: time a client may take to send its request
#: head. Prometheus and the probes of Kubernetes and Docker send it as they connect.
DEFAULT_REQUEST_TIMEOUT_S: Final = 1.0
#: Time a connection may take in all (its head, then reading the answer): a client that
#: never reads cannot hold a connection for ever.
CONNECTION_TIMEOUT_S: Final = 10.0

log: Final = structlog.get_logger("pidctl.http")

_TEXT: Final = "text/plain; charset=utf-8"


class _Connection:
    """One open connection: its stream, the scope it is served in, and whether its request
    head has come (the rest wait to be evicted first)."""

    __slots__ = ("answering", "scope", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.scope = trio.CancelScope()
        self.answering = False

    def close(self) -> None:
        """Cancel its serving and close its socket now (its descriptor is free at once)."""
        self.scope.cancel()
        self.stream.socket.close()


class HttpEndpoint:
    """Answers /metrics, /healthz (the process is up) and /readyz (log recovered, listeners
    bound, and the log not failed), on at most ``max_connections`` connections at once
    (setting ``metrics_max_connections``; see the module's docstring for who makes room)."""

    def __init__(
        self,
        metrics: Metrics,
        max_connections: int,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.metrics = metrics
        self.ready = False
        #: Why the server is not ready although it serves (``/readyz`` says 503 and names
        #: them): e.g. the shared counter went back, or no producer id is left.
        self.faults: dict[str, str] = {}
        self.port = 0
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self._listeners: list[trio.SocketListener] = []
        #: The open connections, oldest first.
        self._open: dict[_Connection, None] = {}

    async def bind(self, address: HostPort) -> None:
        self._listeners = await open_listeners(address)
        self.port = self._listeners[0].socket.getsockname()[1]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept on every listener until cancelled, at most ``max_connections`` open."""
        async with trio.open_nursery() as nursery:
            for listener in self._listeners:
                nursery.start_soon(self._accept_on, listener, nursery)
            task_status.started()

    async def _accept_on(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.error("metrics accept failed; retrying", error=errno.errorcode[e.errno])
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            if len(self._open) >= self.max_connections:
                self._make_room()
            connection = _Connection(stream)
            self._open[connection] = None
            self.metrics.http_connections.inc()
            nursery.start_soon(self._connection, connection)

    def _make_room(self) -> None:
        """Close the connection waiting longest for its request head; if every one has
        sent its request, the oldest."""
        oldest = next(iter(self._open))
        waiting = next((c for c in self._open if not c.answering), oldest)
        self._forget(waiting)
        waiting.close()
        self.metrics.http_connections_evicted.labels("full").inc()

    def _forget(self, connection: _Connection) -> None:
        """No longer counted as open (once: evicted, then ended)."""
        if connection in self._open:
            del self._open[connection]
            self.metrics.http_connections.dec()

    async def _connection(self, connection: _Connection) -> None:
        try:
            with connection.scope, trio.move_on_after(CONNECTION_TIMEOUT_S):
                await self._handle(connection)
        finally:
            self._forget(connection)
            connection.close()

    def answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        """(status line, content type, body) for a request."""
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", _TEXT, b"GET only\n"
        if path == "/healthz":
            return "200 OK", _TEXT, b"ok\n"
        if path == "/readyz":
            if self.ready and not self.faults:
                return "200 OK", _TEXT, b"ready\n"
            reasons = "".join(f"{name}: {text}\n" for name, text in sorted(self.faults.items()))
            return "503 Service Unavailable", _TEXT, b"not ready\n" + reasons.encode()
        if path in ("/metrics", "/"):
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        return "404 Not Found", _TEXT, b"not found\n"

    async def _handle(self, connection: _Connection) -> None:
        stream = connection.stream
        head = b""
        with trio.move_on_after(self.request_timeout_s) as deadline:
            try:
                while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD_BYTES:
                    data = await stream.receive_some(4096)
                    if not data:
                        break
                    head += data
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        if deadline.cancelled_caught:
            self.metrics.http_connections_evicted.labels("timeout").inc()
            return
        connection.answering = True
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if b"\r\n\r\n" not in head and len(head) >= MAX_REQUEST_HEAD_BYTES:
            status, content_type, body = "431 Request Header Fields Too Large", _TEXT, b""
            method = "GET"
        elif len(request_line) != 3:
            status, content_type, body = "400 Bad Request", _TEXT, b"bad request\n"
            method = "GET"
        else:
            method, target = request_line[0], request_line[1]
            status, content_type, body = self.answer(method, target.split("?", 1)[0])
        header = (
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(header if method == "HEAD" else header + body)
