"""Listeners and admission: bind every listener, accept, refuse what is over the limits,
complete TLS, delay what is over the connection-creation rate, then hand the connection to
the :class:`ConnectionServer`."""

from __future__ import annotations

import dataclasses
import errno
import socket
import ssl
import time

import structlog
import trio

from pidctl.controller.api.handlers import ConnectionInfo
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.server.security.x500 import BadCertificate, principal_from_certificate
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.connection import ConnectionServer
from pidctl.controller.server.transport.listeners import ListenerSpec, server_ssl_context
from pidctl.controller.settings import Settings
from pidctl.protocol.addresses import HostPort

log = structlog.get_logger("pidctl.server")


@dataclasses.dataclass(slots=True)
class BoundListener:
    spec: ListenerSpec  # with the advertised host and port
    sockets: list[trio.SocketListener]

    @property
    def port(self) -> int:
        port: int = self.sockets[0].socket.getsockname()[1]
        return port


class ListenFailed(PidctlError):
    """A listener could not be bound (address in use, not permitted, ...)."""


async def open_listeners(address: HostPort) -> list[trio.SocketListener]:
    """Bind ``address``; raises :class:`ListenFailed` naming it."""
    try:
        return await trio.open_tcp_listeners(address.port, host=address.host)
    except OSError as e:
        raise ListenFailed(f"cannot listen on {address}: {e.strerror or e}") from e


async def bind_listeners(settings: Settings) -> list[BoundListener]:
    """Open every listener; each advertises its own address (the first the explicit
    ``advertised_listener`` if set)."""
    bound = []
    for index, (protocol, address) in enumerate(settings.listener_list):
        sockets = await open_listeners(address)
        port = sockets[0].socket.getsockname()[1]
        explicit = settings.advertised_listener if index == 0 else None
        host, advertised_port = advertised_address(address, port, explicit)
        bound.append(BoundListener(ListenerSpec(protocol, host, advertised_port), sockets))
    return bound


def advertised_address(
    listen: HostPort, bound_port: int, explicit: HostPort | None
) -> tuple[str, int]:
    """What clients of a listener are told to connect to: the explicit address if there is
    one, else the listen address with the port actually bound (port 0) and, for a wildcard
    host, this host's name."""
    if explicit is not None:
        return explicit.host, explicit.port
    host = socket.getfqdn() if listen.host in ("0.0.0.0", "::", "") else listen.host
    return host, bound_port


#: accept(2) errors meaning "not now" (no descriptor, no memory): accept again after
#: ACCEPT_RETRY_S seconds, as trio.serve_listeners does.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_S = 0.1


class Admission:
    """Decides which accepted connections are served, and sets each one up."""

    def __init__(
        self, settings: Settings, server: ConnectionServer, quotas: Quotas, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.server = server
        self.quotas = quotas
        self.metrics = metrics
        self._per_address: dict[str, int] = {}
        self._open = 0

    async def accept(self, bound: list[BoundListener], nursery: trio.Nursery) -> None:
        """Accept on every listener until cancelled; connections run in ``nursery``."""
        context = None
        if any(b.spec.tls for b in bound):
            context = server_ssl_context(self.settings)
        async with trio.open_nursery() as acceptors:
            for listener in bound:
                for sock in listener.sockets:
                    acceptors.start_soon(self._accept_on, sock, listener.spec, context, nursery)

    async def _accept_on(
        self,
        sock: trio.SocketListener,
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
        nursery: trio.Nursery,
    ) -> None:
        # trio.serve_listeners would do, but it closes every connection once more after its
        # handler (a cancel scope and a cancelled checkpoint each): a tenth of a start-up
        # storm's CPU. Each connection here is closed by _admit.
        while True:
            try:
                stream = await sock.accept()
            except OSError as e:
                if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of descriptors or memory now: connections ending will free some.
                log.error("accept failed; retrying", error=errno.errorcode[e.errno])
                await trio.sleep(ACCEPT_RETRY_S)
            else:
                nursery.start_soon(self._admit, spec, context, stream)

    def _refusal(self, address: str) -> str | None:
        if self._open >= self.settings.max_connections:
            return "max_connections"
        if self._per_address.get(address, 0) >= self.settings.max_connections_per_address:
            return "max_connections_per_address"
        return None

    async def _admit(
        self, spec: ListenerSpec, context: ssl.SSLContext | None, tcp: trio.SocketStream
    ) -> None:
        try:
            await self._admit_open(spec, context, tcp)
        finally:
            # Closed (gracefully) on every ordinary path already; this covers the others (a
            # shutdown cancelling a delayed connection) at no cost: closing twice is a no-op.
            tcp.socket.close()

    async def _admit_open(
        self, spec: ListenerSpec, context: ssl.SSLContext | None, tcp: trio.SocketStream
    ) -> None:
        try:
            address, port = tcp.socket.getpeername()[:2]
        except OSError:
            return
        info = ConnectionInfo(
            peer=f"{address}:{port}",
            host=address,
            advertised_host=spec.host,
            advertised_port=spec.port,
        )
        refused = self._refusal(address)
        if refused:
            log.warning("connection refused", peer=info.peer, reason=refused)
            self.metrics.connections_closed.labels(refused).inc()
            await tcp.aclose()
            return
        self._open += 1
        self._per_address[address] = self._per_address.get(address, 0) + 1
        try:
            await self._serve(spec, context, tcp, address, info)
        except Exception:
            # A bug met by one connection must not take the server down: that connection
            # is closed, the others go on. Nothing half-done can have reached the log
            # (records are checked before they are appended).
            log.exception("connection failed", peer=info.peer)
            self.metrics.connections_closed.labels("internal_error").inc()
            await trio.aclose_forcefully(tcp)
        finally:
            self._open -= 1
            left = self._per_address[address] - 1
            if left:
                self._per_address[address] = left
            else:
                del self._per_address[address]

    async def _serve(
        self,
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
        tcp: trio.SocketStream,
        address: str,
        info: ConnectionInfo,
    ) -> None:
        stream: trio.abc.Stream = tcp
        if spec.tls and context is not None:
            tls = trio.SSLStream(tcp, context, server_side=True)
            failure = None
            with trio.move_on_after(self.settings.frame_timeout_ms / 1000) as handshake:
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, ssl.SSLError) as broken:
                    failure = str(broken)
            if handshake.cancelled_caught:
                failure = "no TLS handshake in time"
            if failure is not None:
                log.warning("tls handshake failed", peer=info.peer, reason=failure)
                self.metrics.authentication_failures.labels("TLS").inc()
                await trio.aclose_forcefully(tcp)
                return
            try:
                certified = principal_from_certificate(tls.getpeercert(True))
            except BadCertificate as bad:  # verified by OpenSSL, so not expected: refuse
                log.warning("client certificate unreadable", peer=info.peer, reason=str(bad))
                self.metrics.authentication_failures.labels("TLS").inc()
                await trio.aclose_forcefully(tcp)
                return
            if certified and not spec.sasl:
                info = dataclasses.replace(info, principal=certified)
            stream = tls
        delay = self.quotas.connection(address, time.monotonic())
        if delay:
            # KIP-612: over the creation rate, the connection waits before it is served.
            self.metrics.throttled.labels("connection").inc()
            self.metrics.throttle_seconds.labels("connection").inc(delay)
            await trio.sleep(delay)
        metrics = self.metrics
        metrics.connections_accepted.inc()
        metrics.connections.inc()
        reason = "client"
        try:
            async with stream:
                reason = await self.server.serve(stream, info, spec.sasl)
        finally:
            metrics.connections.dec()
            metrics.connections_closed.labels(reason).inc()
