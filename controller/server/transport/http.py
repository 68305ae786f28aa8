"""/metrics, /healthz and /readyz, served on the event loop.

No thread of its own: a scrape is a few milliseconds of the loop every few seconds, where a
server thread would compete with the request path for the GIL all the time. A minimal
HTTP/1.1 responder (one request per connection, ``Connection: close``) is all Prometheus and
a container's health check need.
"""

from __future__ import annotations

import contextlib
import errno

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
MAX_REQUEST_HEAD_BYTES = 8192
#: Time a client may take to send its request head.
REQUEST_TIMEOUT_S = 5.0
#: Time a connection may take in all (its head, then reading the answer): a client that
#: never reads cannot hold one of the few connections for ever.
CONNECTION_TIMEOUT_S = 10.0

log = structlog.get_logger("pidctl.http")

_TEXT = "text/plain; charset=utf-8"


class HttpEndpoint:
    """Answers /metrics, /healthz (the process is up) and /readyz (log recovered, listeners
    bound, and the log not failed), on at most ``max_connections`` connections at once
    (setting ``metrics_max_connections``)."""

    def __init__(self, metrics: Metrics, max_connections: int) -> None:
        self.metrics = metrics
        self.ready = False
        #: Why the server is not ready although it serves (``/readyz`` says 503 and names
        #: them): e.g. the shared counter went back, or no producer id is left.
        self.faults: dict[str, str] = {}
        self.port = 0
        self.max_connections = max_connections
        self._listeners: list[trio.SocketListener] = []
        # One slot per open connection, taken before accept(): at the bound nothing is
        # accepted (no descriptor is taken) until a connection ends, as Kafka's acceptor
        # does at max.connections.
        self._slots = trio.Semaphore(max_connections)

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
            if self._slots.value == 0:
                self.metrics.http_connections_waited.inc()
            await self._slots.acquire()
            try:
                stream = await listener.accept()
            except OSError as e:
                self._slots.release()
                if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.error("metrics accept failed; retrying", error=errno.errorcode[e.errno])
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            except BaseException:
                self._slots.release()
                raise
            nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.metrics.http_connections.inc()
        try:
            with trio.move_on_after(CONNECTION_TIMEOUT_S):
                await self._handle(stream)
        finally:
            stream.socket.close()
            self.metrics.http_connections.dec()
            self._slots.release()

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

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                try:
                    while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD_BYTES:
                        data = await stream.receive_some(4096)
                        if not data:
                            break
                        head += data
                except trio.BrokenResourceError:
                    return
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
