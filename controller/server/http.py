"""/metrics, /healthz and /readyz, served on the event loop.

No thread of its own: a scrape is a few milliseconds of the loop every few seconds, where a
server thread would compete with the request path for the GIL all the time. A minimal
HTTP/1.1 responder (one request per connection, ``Connection: close``) is all Prometheus and
a container's health check need.
"""

from __future__ import annotations

import contextlib

import trio
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from pidctl.controller.server.admission import open_listeners
from pidctl.controller.server.metrics import Metrics
from pidctl.protocol.addresses import HostPort

#: Bytes of a request head read at most; a scrape sends a few hundred.
MAX_REQUEST_HEAD_BYTES = 8192
#: Time a client may take to send its request head.
REQUEST_TIMEOUT_S = 5.0

_TEXT = "text/plain; charset=utf-8"


class HttpEndpoint:
    """Answers /metrics, /healthz (the process is up) and /readyz (log recovered, listeners
    bound, and the log not failed)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.ready = False
        self.port = 0
        self._listeners: list[trio.SocketListener] = []

    async def bind(self, address: HostPort) -> None:
        self._listeners = await open_listeners(address)
        self.port = self._listeners[0].socket.getsockname()[1]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.serve_listeners(self._handle, self._listeners)

    def answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        """(status line, content type, body) for a request."""
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", _TEXT, b"GET only\n"
        if path == "/healthz":
            return "200 OK", _TEXT, b"ok\n"
        if path == "/readyz":
            if self.ready:
                return "200 OK", _TEXT, b"ready\n"
            return "503 Service Unavailable", _TEXT, b"not ready\n"
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
