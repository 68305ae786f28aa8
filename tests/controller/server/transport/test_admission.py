"""Admission (admission.py) in this process: real listeners bound as ``pidctl serve`` binds
them, real loopback clients (from 127.0.0.1, .2 and .3: addresses of their own), real TLS;
what is over the connection limits is closed at once and counted, what is over the creation
rate waits, a TLS handshake that fails or never comes is closed, a client certificate names
the principal, and a bug met by one connection closes only that one."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trustme

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.quorum import Now
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.server.transport.admission import (
    ACCEPTS_PER_WAKE,
    Admission,
    BoundListener,
    bind_listeners,
)
from pidctl.controller.server.transport.socket_io import close_socket
from pidctl.controller.settings import Settings
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import Request
from tests.controller.server.conftest import Peer, Served, serving, until


@asynccontextmanager
async def admitting(
    data_dir: Path, settings: Settings, quotas: Quotas | None = None
) -> AsyncIterator[tuple[Served, list[BoundListener]]]:
    """A served controller (conftest.serving) behind :class:`Admission`, accepting on the
    settings' listeners (each on a port of its own choosing)."""
    quotas = quotas or Quotas({})
    async with serving(data_dir, quotas=quotas) as served:
        bound = await bind_listeners(settings)
        admission = Admission(settings, served.server, quotas, served.metrics)
        accepting, stopped = trio.CancelScope(), trio.Event()

        async def accept() -> None:
            try:
                with accepting:
                    await admission.accept(bound, served.nursery)
            finally:
                stopped.set()

        served.nursery.start_soon(accept)
        try:
            yield served, bound
        finally:
            accepting.cancel()  # as the server stops: no more accepts, then the close
            await stopped.wait()
            for listener in bound:
                for sock in listener.sockets:
                    close_socket(sock)


def plain(**changes: Any) -> Settings:
    return Settings(listeners="PLAINTEXT://127.0.0.1:0", **changes)


async def connect(bound: list[BoundListener], source: str = "127.0.0.1") -> Peer:
    stream = await trio.open_tcp_stream("127.0.0.1", bound[0].port, local_address=source)
    return Peer(stream)


async def served_now(peer: Peer) -> bool:
    return bool((await peer.request(requests.api_versions())).error_code == 0)


def closed_because(served: Served, reason: str) -> float:
    return served.metric("pidctl_connections_closed_total", reason=reason)


# -- limits -------------------------------------------------------------------------------


async def test_connections_over_the_per_address_limit_are_closed_at_once(tmp_path: Path) -> None:
    settings = plain(max_connections_per_address=2)
    async with admitting(tmp_path, settings) as (served, bound):
        first, second = await connect(bound), await connect(bound)
        assert await served_now(first) and await served_now(second)
        assert await (await connect(bound)).closed() == []
        assert closed_because(served, "max_connections_per_address") == 1
        elsewhere = await connect(bound, "127.0.0.2")  # another address: a count of its own
        assert await served_now(elsewhere)
        # A connection that ends gives its place back.
        await first.stream.aclose()
        await until(lambda: closed_because(served, "client") == 1)
        third = await connect(bound)
        assert await served_now(third)
        assert closed_because(served, "max_connections_per_address") == 1
        assert served.metric("pidctl_connections") == 3


async def test_a_flood_of_refused_connections_is_counted_each_and_logged_once(
    tmp_path: Path,
) -> None:
    """Refusals are a client's doing: the metric counts every one, the log says it once
    (then at most every ALARM_LOG_INTERVAL_S, with how many), not once per connection."""
    async with admitting(tmp_path, plain(max_connections_per_address=1)) as (served, bound):
        first = await connect(bound)
        assert await served_now(first)
        with structlog.testing.capture_logs() as logs:
            for _ in range(50):
                assert await (await connect(bound)).closed() == []
        assert closed_because(served, "max_connections_per_address") == 50
    refusals = [line for line in logs if line["event"] == "connection refused"]
    assert len(refusals) == 1
    assert refusals[0]["reason"] == "max_connections_per_address" and refusals[0]["times"] == 1


async def test_connections_over_the_total_limit_are_closed_at_once(tmp_path: Path) -> None:
    async with admitting(tmp_path, plain(max_connections=2)) as (served, bound):
        first, second = await connect(bound, "127.0.0.1"), await connect(bound, "127.0.0.2")
        assert await served_now(first) and await served_now(second)
        assert await (await connect(bound, "127.0.0.3")).closed() == []
        assert closed_because(served, "max_connections") == 1
        await first.stream.aclose()
        await until(lambda: closed_because(served, "client") == 1)
        third = await connect(bound, "127.0.0.3")
        assert await served_now(third)
        assert served.metric("pidctl_connections") == 2


async def test_a_burst_larger_than_one_batch_of_accepts_is_served_whole(tmp_path: Path) -> None:
    """Connections waiting in the backlog are taken ACCEPTS_PER_WAKE at a time, with the
    other tasks run between batches: every one of three batches and more is served."""
    count = 3 * ACCEPTS_PER_WAKE + 1
    async with admitting(tmp_path, plain()) as (served, bound):
        waiting = []
        for _ in range(count):  # connected by the kernel, none accepted yet (no await)
            sock = socket.create_connection(("127.0.0.1", bound[0].port))
            sock.setblocking(False)
            waiting.append(Peer(trio.SocketStream(trio.socket.from_stdlib_socket(sock))))
        for peer in waiting:
            assert await served_now(peer)
        assert served.metric("pidctl_connections") == count
        assert served.metric("pidctl_connections_accepted_total") == count


async def test_a_connection_over_the_creation_rate_waits_before_it_is_served(
    tmp_path: Path,
) -> None:
    """KIP-612: accepted, then served only after the delay its address's rate asks for."""
    quotas = Quotas({}, connection_rate=10.0, window_s=0.1)  # a burst of one a tenth
    async with admitting(tmp_path, plain(), quotas) as (served, bound):
        assert await served_now(await connect(bound))
        started = trio.current_time()
        assert await served_now(await connect(bound))  # the second from 127.0.0.1
        waited = trio.current_time() - started
        assert await served_now(await connect(bound, "127.0.0.2"))  # a rate of its own
    delay = served.metric("pidctl_throttle_seconds_total", api="connection")
    assert served.metric("pidctl_throttled_requests_total", api="connection") == 1
    assert 0 < delay <= 0.1 and waited >= delay


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_settings(ca: trustme.CA, directory: Path, **changes: Any) -> Settings:
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return Settings(
        listeners="SSL://127.0.0.1:0",
        ssl_certfile=str(directory / "server.pem"),
        ssl_keyfile=str(directory / "server.pem"),
        ssl_cafile=str(directory / "ca.pem"),
        ssl_client_auth="requested",
        **changes,
    )


async def tls_connect(bound: list[BoundListener], ca: trustme.CA, user: str | None) -> Peer:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if user is not None:
        ca.issue_cert(f"{user}@example.org", common_name=user).configure_cert(context)
    tcp = await trio.open_tcp_stream("127.0.0.1", bound[0].port)
    return Peer(trio.SSLStream(tcp, context, server_hostname="127.0.0.1"))


async def test_a_client_certificate_names_the_principal(tmp_path: Path, ca: trustme.CA) -> None:
    async with admitting(tmp_path, tls_settings(ca, tmp_path)) as (served, bound):
        anonymous = await tls_connect(bound, ca, None)
        assert (await anonymous.request(requests.allocate(-1, -1))).error_code == 0
        alice = await tls_connect(bound, ca, "alice")
        assert (await alice.request(requests.allocate(-1, -1))).error_code == 0
    principals = [r.principal for r in served.records if isinstance(r, ProducerIdsGranted)]
    assert principals[0] == "User:ANONYMOUS"
    assert principals[1] is not None and principals[1].startswith("User:CN=alice,")


async def test_a_failed_tls_handshake_is_closed_and_counted(tmp_path: Path, ca: trustme.CA) -> None:
    async with admitting(tmp_path, tls_settings(ca, tmp_path)) as (served, bound):
        plaintext = Peer(await trio.open_tcp_stream("127.0.0.1", bound[0].port))
        await plaintext.send(requests.api_versions())  # not a ClientHello
        assert await plaintext.closed() == []
        await until(
            lambda: served.metric("pidctl_authentication_failures_total", mechanism="TLS") == 1
        )
        assert served.metric("pidctl_connections_accepted_total") == 0  # never served


async def test_a_tls_handshake_that_never_comes_is_cut_off(tmp_path: Path, ca: trustme.CA) -> None:
    settings = tls_settings(ca, tmp_path, frame_timeout_ms=200)
    async with admitting(tmp_path, settings) as (served, bound):
        started = trio.current_time()  # before the connect: the server counts from its accept
        silent = Peer(await trio.open_tcp_stream("127.0.0.1", bound[0].port))
        assert await silent.closed() == []
        assert trio.current_time() - started >= 0.2
        await until(
            lambda: served.metric("pidctl_authentication_failures_total", mechanism="TLS") == 1
        )


# -- isolation ----------------------------------------------------------------------------


async def test_a_bug_met_by_one_connection_closes_only_that_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug cannot be had from the real controller on purpose: its Metadata handler is
    made to raise here, for this test only (in its table of handlers: a compiled
    controller's methods cannot be replaced)."""
    async with admitting(tmp_path, plain(max_connections_per_address=2)) as (served, bound):

        def buggy(request: Request, now: Now, conn: ConnectionInfo) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setitem(served.controller._handlers, ApiKey.METADATA, buggy)
        other = await connect(bound)
        assert await served_now(other)
        unlucky = await connect(bound)
        await unlucky.send(requests.metadata(None))
        assert await unlucky.closed() == []
        await until(lambda: closed_because(served, "internal_error") == 1)
        assert await served_now(other)  # the other connection goes on
        assert await served_now(await connect(bound))  # and the place was given back
