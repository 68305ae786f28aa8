"""Listeners and admission: bind every listener, accept, refuse what is over the limits,
complete TLS, delay what is over the connection-creation rate, then hand the connection to
the :class:`ConnectionTasks`."""

from __future__ import annotations

import dataclasses
import errno
import socket
import ssl
import time
from typing import Any, Final

import structlog
import trio

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.server.security.x500 import BadCertificate, principal_from_certificate
from pidctl.controller.server.telemetry.alarms import ThrottledLine
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.connection import ConnectionTasks
from pidctl.controller.server.transport.listeners import ListenerSpec, server_ssl_context
from pidctl.controller.server.transport.socket_io import close_socket
from pidctl.controller.settings import Settings
from pidctl.protocol.addresses import HostPort

log: Final = structlog.get_logger("pidctl.server")

#: The option's number, 0 where the platform has none (no TCP option is numbered 0; and
#: compiled, a ``Final`` that may be None is misread as an int).
_NOTSENT_LOWAT: Final[int] = getattr(socket, "TCP_NOTSENT_LOWAT", 0)
_TASK_NAME: Final = "pidctl connection"


@dataclasses.dataclass(slots=True)
class BoundListener:
    spec: ListenerSpec  # with the advertised host and port
    #: The listening sockets, the standard library's (non-blocking): accepted from by
    #: :class:`Admission` directly (see ``_accept_on``); closed by :func:`close_socket`.
    sockets: list[socket.socket]

    @property
    def port(self) -> int:
        port: int = self.sockets[0].getsockname()[1]
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
        sockets = [standard_socket(listener.socket) for listener in await open_listeners(address)]
        port = sockets[0].getsockname()[1]
        explicit = settings.advertised_listener if index == 0 else None
        host, advertised_port = advertised_address(address, port, explicit)
        bound.append(BoundListener(ListenerSpec(protocol, host, advertised_port), sockets))
    return bound


def standard_socket(sock: trio.socket.SocketType) -> socket.socket:
    """The standard library's socket, non-blocking, for one trio made (a listener trio bound:
    trio resolved the address and set the options); the trio object is done with it."""
    standard = socket.socket(fileno=sock.detach())
    standard.setblocking(False)
    return standard


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
ACCEPT_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_S: Final = 0.1
#: accept(2) errors reporting a connection that failed before it was accepted (reset in the
#: backlog, refused by a firewall, the network gone): nothing to serve, accept the next.
#: The same list as trio's SocketListener skips.
ACCEPT_SKIPPED_ERRNOS: Final = frozenset(
    getattr(errno, name)
    for name in (
        "EPERM",
        "ECONNABORTED",
        "ECONNRESET",
        "EPROTO",
        "ENETDOWN",
        "ENETUNREACH",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENONET",
        "EOPNOTSUPP",
        "ENOSR",
        "ESOCKTNOSUPPORT",
        "EPROTONOSUPPORT",
        "ETIMEDOUT",
    )
    if hasattr(errno, name)
)
#: Connections accepted from one listener in a row before the other tasks run: a storm of
#: connections is taken in batches, and the requests of those already in are answered
#: between them.
ACCEPTS_PER_WAKE: Final = 64
#: What trio's SocketStream sets on each connection, and so each accepted socket here:
#: answers leave at once (TCP_NODELAY), and the kernel holds at most 16 KiB unsent per
#: connection (TCP_NOTSENT_LOWAT: past it a write takes nothing, and the outbox holds the
#: rest, counted against max_unwritten_bytes_per_connection).
NOTSENT_LOWAT_BYTES: Final = 16 * 1024


class Admission:
    """Decides which accepted connections are served, and sets each one up."""

    def __init__(
        self, settings: Settings, server: ConnectionTasks, quotas: Quotas, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.server = server
        self.quotas = quotas
        self.metrics = metrics
        self._per_address: dict[str, int] = {}
        self._open = 0
        self._refusal_lines = {
            reason: ThrottledLine() for reason in ("max_connections", "max_connections_per_address")
        }

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
        listening: socket.socket,
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
        nursery: trio.Nursery,
    ) -> None:
        # Accepted here on the standard library's sockets, not through trio's listener and
        # streams: trio passes through the scheduler after every accept and on every close,
        # and asks the peer's address of the kernel once more; that was half of a start-up
        # storm's CPU (compiled). A plain TCP connection needs no trio stream (its reads and
        # writes are on its descriptor: socket_io.py); a TLS one gets one (_serve). The
        # listening socket is closed only once this has ended (app.py): an accept woken
        # before the shutdown's cancel could otherwise run on a closed socket.
        while True:
            await trio.lowlevel.wait_readable(listening)
            for _ in range(ACCEPTS_PER_WAKE):
                try:
                    conn, peer = listening.accept()
                except BlockingIOError:
                    break  # none left: wait again
                except OSError as e:
                    if e.errno in ACCEPT_SKIPPED_ERRNOS:
                        continue
                    if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                        # Not one connection's failure, nor "not now": the listener itself
                        # is broken, and the server stops (said here: the exit's one line
                        # names only the errno).
                        log.error(
                            "accept failed; stopping",
                            listener=f"{spec.protocol}://{spec.host}:{spec.port}",
                            error=errno.errorcode.get(e.errno or 0, str(e.errno)),
                        )
                        raise
                    # Out of descriptors or memory now: connections ending will free some.
                    log.error("accept failed; retrying", error=errno.errorcode[e.errno])
                    await trio.sleep(ACCEPT_RETRY_S)
                    break
                self._take(conn, peer, spec, context, nursery)

    def _take(
        self,
        conn: socket.socket,
        peer: tuple[Any, ...],
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
        nursery: trio.Nursery,
    ) -> None:
        """Refuse a connection over the limits at once (closed before the next accept, so
        that refused connections hold no descriptors the budget does not count), or count
        it and start its task."""
        address, port = peer[:2]  # (IPv6 adds the flow and scope)
        peer_name = f"{address}:{port}"
        refused = self._refusal(address)
        if refused:
            conn.close()  # (never known to trio)
            self.metrics.connections_closed.labels(refused).inc()
            # A flood over the limits is a client's doing: one line at once, then one every
            # ALARM_LOG_INTERVAL_S per reason, with how many were refused (the metric
            # counts each).
            times = self._refusal_lines[refused].due(refused)
            if times:
                log.warning("connection refused", peer=peer_name, reason=refused, times=times)
            return
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if _NOTSENT_LOWAT:
                conn.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
        except OSError:  # (gone already: nothing to serve)
            conn.close()
            return
        info = ConnectionInfo(
            peer=peer_name, host=address, advertised_host=spec.host, advertised_port=spec.port
        )
        # Counted now, before the next accept: every connection of a batch meets the limits
        # as they stand with the ones before it.
        self._open += 1
        self._per_address[address] = self._per_address.get(address, 0) + 1
        # (Named here: trio would otherwise name the task from the compiled method, which
        # has no __qualname__, through an AttributeError and a repr.)
        nursery.start_soon(self._admit, spec, context, conn, info, name=_TASK_NAME)

    def _refusal(self, address: str) -> str | None:
        if self._open >= self.settings.max_connections:
            return "max_connections"
        if self._per_address.get(address, 0) >= self.settings.max_connections_per_address:
            return "max_connections_per_address"
        return None

    async def _admit(
        self,
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
        conn: socket.socket,
        info: ConnectionInfo,
    ) -> None:
        address = info.host
        try:
            await self._serve(spec, context, conn, address, info)
        except Exception:
            # A bug met by one connection must not take the server down: that connection
            # is closed, the others go on. Nothing half-done can have reached the log
            # (records are checked before they are appended).
            log.exception("connection failed", peer=info.peer)
            self.metrics.connections_closed.labels("internal_error").inc()
        finally:
            # Closed (gracefully) on every ordinary path already; this covers the others (a
            # bug, a shutdown cancelling a delayed connection: a forceful close, under a TLS
            # stream too) at no cost: closing twice is a no-op.
            close_socket(conn)
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
        conn: socket.socket,
        address: str,
        info: ConnectionInfo,
    ) -> None:
        tls: trio.SSLStream[trio.SocketStream] | None = None
        if spec.tls and context is not None:
            tcp = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
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
            if tls is None:
                try:
                    reason = await self.server.serve(conn, info, spec.sasl)
                finally:
                    close_socket(conn)
            else:
                async with tls:  # (its close says close_notify first)
                    reason = await self.server.serve(tls, info, spec.sasl)
        finally:
            metrics.connections.dec()
            metrics.connections_closed.labels(reason).inc()
