"""The metrics endpoint on the event loop, over a real loopback socket."""

from __future__ import annotations

import contextlib

import trio

from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.http import MAX_REQUEST_HEAD_BYTES, HttpEndpoint
from pidctl.protocol.addresses import HostPort


async def _get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        answer = b""
        while data := await stream.receive_some(65536):
            answer += data
    return answer


async def test_paths_statuses_and_methods() -> None:
    endpoint = HttpEndpoint(Metrics(), 4)
    await endpoint.bind(HostPort("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        port = endpoint.port

        async def status(request: bytes) -> bytes:
            return (await _get(port, request)).split(b"\r\n", 1)[0]

        assert await status(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 200 OK"
        not_ready = b"HTTP/1.1 503 Service Unavailable"
        assert await status(b"GET /readyz HTTP/1.1\r\n\r\n") == not_ready
        endpoint.ready = True
        assert await status(b"GET /readyz?x=1 HTTP/1.1\r\n\r\n") == b"HTTP/1.1 200 OK"
        metrics = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert b"pidctl_connections 0.0" in metrics
        assert await status(b"GET /nope HTTP/1.1\r\n\r\n") == b"HTTP/1.1 404 Not Found"
        assert await status(b"POST /metrics HTTP/1.1\r\n\r\n") == b"HTTP/1.1 405 Method Not Allowed"
        assert await status(b"nonsense\r\n\r\n") == b"HTTP/1.1 400 Bad Request"
        head = await _get(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head.endswith(b"\r\n\r\n")  # headers only
        # A head that never ends is cut at the limit, not buffered without bound: refused
        # (the refusal may arrive as a reset, since the rest is never read).
        endless = b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_REQUEST_HEAD_BYTES // 6)
        with contextlib.suppress(trio.BrokenResourceError):
            assert await status(endless) == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert await status(b"GET /healthz HTTP/1.1\r\n\r\n") == b"HTTP/1.1 200 OK"
        nursery.cancel_scope.cancel()


async def test_a_connection_held_silent_makes_room_for_one_that_asks() -> None:
    """At most max_connections are open; one more is accepted all the same, and the one
    that has waited longest for its request head is closed for it: connections held open
    without a request cannot keep a probe out."""
    metrics = Metrics()
    endpoint = HttpEndpoint(metrics, 2, request_timeout_s=60)
    await endpoint.bind(HostPort("127.0.0.1", 0))

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        silent = [await trio.open_tcp_stream("127.0.0.1", endpoint.port) for _ in range(2)]
        with trio.fail_after(30):
            while sample("pidctl_http_connections") < 2:
                await trio.sleep(0.01)
            answer = await _get(endpoint.port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert sample("pidctl_http_connections_evicted_total", reason="full") == 1
        # The oldest silent one was closed for it; the other is still open.
        assert await silent[0].receive_some(10) == b""
        with trio.move_on_after(0.1):
            await silent[1].receive_some(10)
            raise AssertionError("the newer silent connection was closed too")
        assert sample("pidctl_http_connections") <= 2
        for stream in silent:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_request_head_not_sent_in_time_closes_the_connection() -> None:
    metrics = Metrics()
    endpoint = HttpEndpoint(metrics, 4, request_timeout_s=0.2)
    await endpoint.bind(HostPort("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        slow = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
        await slow.send_all(b"GET /healthz HTTP/1.1\r\n")  # and never the rest
        with trio.fail_after(30):
            assert await slow.receive_some(10) == b""  # closed, unanswered
        assert (
            metrics.registry.get_sample_value(
                "pidctl_http_connections_evicted_total", {"reason": "timeout"}
            )
            == 1
        )
        await slow.aclose()
        nursery.cancel_scope.cancel()


def test_the_request_timeouts_default_is_the_settings() -> None:
    from pidctl.controller.server.transport.http import DEFAULT_REQUEST_TIMEOUT_S
    from pidctl.controller.settings import Settings

    assert Settings().metrics_request_timeout_ms == DEFAULT_REQUEST_TIMEOUT_S * 1000
