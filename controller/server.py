"""The trio server: one task per connection, pipelined requests answered in order.

Per connection a reader task decodes frames and has the controller decide each request at
once (so decisions happen in arrival order), and a writer task sends each response as soon
as the log says its records are durable. The queue between them holds at most
``max_in_flight_per_connection`` responses; when a client stops reading our responses, the
queue fills, the reader stops reading, and TCP pushes back on the client.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
import trio
from kio.schema.errors import ErrorCode

from protocol import __version__
from protocol.api_versions import unsupported_version_response
from protocol.apis import ApiKey
from protocol.codec import (
    ProtocolViolation,
    UnsupportedApiVersionsVersion,
    decode_request,
    encode_response,
)
from protocol.framing import FrameDecoder, FrameError

from .acl import Authorizer
from .brokers import BrokerSessions
from .hostport import HostPort
from .lease_keeper import LeaseKeeper, etcd_counter
from .leases import lease_remaining
from .listeners import ListenerSpec, principal_from_certificate, server_ssl_context
from .metalog import MetadataLog, lock_data_dir, recover
from .metrics import HttpEndpoint, Metrics, StateView, api_name
from .producer_ids import remaining_producer_ids
from .quotas import Quotas
from .records import ClusterCreated, ControllerStarted, ProducerIdsGranted, new_cluster_id
from .sasl import CredentialStore
from .sasl_session import ALLOWED_BEFORE_AUTHENTICATION, SaslSession
from .service import NO_WAIT, ConnectionInfo, Controller, ControllerConfig, Now
from .settings import Settings

log = structlog.get_logger("pidctl.server")

#: Bytes asked of the socket per read. Requests are small; 64 KiB takes many pipelined ones
#: in one system call without holding much memory per connection.
RECEIVE_BYTES = 64 * 1024


def now() -> Now:
    return Now(time.time_ns() // 1_000_000, time.monotonic_ns() // 1_000_000)


@dataclass(frozen=True, slots=True)
class _Outgoing:
    data: bytes
    durable_offset: int
    api: str = "api_versions"
    received: float = 0.0  # perf_counter() when the request arrived


class PidctlServer:
    """Owns the metadata log, the controller and the listeners of one ``pidctl serve``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ports: list[int] = []
        self._stopping = trio.Event()
        self._readers: set[trio.CancelScope] = set()
        self._per_address: dict[str, int] = {}
        self.metrics = Metrics()
        # Decided once: building the request log's fields costs on every request otherwise.
        self._log_requests = settings.log_level == "debug"
        self.quotas = Quotas(
            {
                ApiKey.ALLOCATE_PRODUCER_IDS: settings.allocate_producer_ids_quota,
                ApiKey.INIT_PRODUCER_ID: settings.init_producer_id_quota,
            },
            connection_rate=settings.connection_creation_rate,
            window_s=settings.quota_window_ms / 1000,
            overrides=settings.quota_overrides,
        )

        self.authorizer = build_authorizer(settings)
        self.credentials = load_credentials(settings)
        self.controller: Controller | None = None
        self.lease_keeper: LeaseKeeper | None = None

    def reload(self, settings: Settings) -> None:
        """SIGHUP: take new ACLs, super users and SASL credentials; nothing else changes."""
        self.authorizer = build_authorizer(settings)
        self.credentials = load_credentials(settings)
        if self.controller is not None:
            self.controller.authorizer = self.authorizer
        log.info("configuration reloaded", acls=len(self.authorizer.acls),
                 users=len(self.credentials.users))  # fmt: skip

    def request_shutdown(self) -> None:
        """Stop accepting, stop reading, finish in-flight responses, flush, return."""
        self._stopping.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        settings = self.settings
        data_dir = Path(settings.data_dir)
        lock_fd = lock_data_dir(data_dir)
        # Up before recovery, so /healthz answers (and /readyz says 503) while it runs.
        self.http = HttpEndpoint(self.metrics, settings.metrics_listen.host,
                                 settings.metrics_listen.port)  # fmt: skip
        self.http.start()
        log.info("metrics listening", address=str(settings.metrics_listen), port=self.http.port)
        try:
            await self._run(data_dir, task_status)
        finally:
            self.http.ready = False
            self.http.stop()
            os.close(lock_fd)

    async def _run(self, data_dir: Path, task_status: trio.TaskStatus[None]) -> None:
        settings = self.settings
        started = time.monotonic()
        recovery = await trio.to_thread.run_sync(recover, data_dir)
        state = recovery.state
        self.metrics.recovery_seconds.set(time.monotonic() - started)
        log.info(
            "log recovered",
            data_dir=str(data_dir),
            next_offset=state.next_offset,
            snapshot_offset=recovery.snapshot_offset,
            records_replayed=recovery.records_replayed,
            truncated_bytes=recovery.truncated_bytes,
            next_producer_id=state.next_producer_id,
            seconds=round(time.monotonic() - started, 4),
        )
        controller: Controller
        metalog = MetadataLog(
            data_dir,
            state.next_offset,
            recovery.snapshot_offset,
            lambda: controller.snapshot(),
            segment_max_bytes=settings.segment_max_bytes,
            snapshot_interval_records=settings.snapshot_interval_records,
            retention_bytes=settings.log_retention_bytes,
            on_batch=self.metrics.log_batch,
            on_snapshot=self.metrics.snapshot_written,
        )
        sessions = BrokerSessions(settings.broker_session_timeout_ms)
        sessions.restore(list(state.brokers), now().mono_ms)
        config = ControllerConfig(
            node_id=settings.node_id,
            pid_range=settings.pid_range,
            max_transaction_timeout_ms=settings.transaction_max_timeout_ms,
            transactional_id_expiration_ms=settings.transactional_id_expiration_ms,
        )
        controller = Controller(
            state, metalog, config=config, sessions=sessions, on_grant=self._granted,
            authorizer=self.authorizer,
        )  # fmt: skip
        self.controller = controller
        self.lease_keeper = self._lease_keeper(controller, metalog)
        if not self.authorizer.enabled:
            log.warning(
                "no authorizer: every client may do everything, as Kafka without an authorizer;"
                ' set authorizer = "acl" and acls to restrict'
            )
        self.metrics.state_view = StateView(
            next_producer_id=lambda: state.next_producer_id,
            remaining_producer_ids=lambda: remaining_producer_ids(state, config.pid_range),
            registered_brokers=lambda: len(state.brokers),
            fenced_brokers=lambda: sum(
                sessions.is_fenced(b, now().mono_ms) for b in list(state.brokers)
            ),
            transactional_ids=lambda: len(state.transactional_ids),
            lease_remaining=lambda: lease_remaining(state),
        )
        self.metalog = metalog
        async with trio.open_nursery() as log_nursery:
            await log_nursery.start(metalog.run)
            self._initialise_cluster(controller)
            await metalog.flush()
            log_nursery.start_soon(self._expire_transactional_ids, controller)
            if self.lease_keeper is not None:
                await log_nursery.start(self.lease_keeper.run)
                if lease_remaining(state) == 0:
                    # A first lease before listening, so the first clients are served; a
                    # controller that cannot reach etcd still starts (and answers retriably).
                    with trio.move_on_after(settings.etcd_timeout_ms / 1000):
                        await self.lease_keeper.leased.wait()
            try:
                await self._serve(controller, metalog, task_status)
                await metalog.flush()
            finally:
                if self.lease_keeper is not None:
                    with trio.CancelScope(shield=True):
                        await self.lease_keeper.counter.aclose()
            log_nursery.cancel_scope.cancel()
        log.info("stopped", next_offset=state.next_offset)

    def _lease_keeper(self, controller: Controller, metalog: MetadataLog) -> LeaseKeeper | None:
        """With ``pid_source``: the task that leases from etcd. Without: refuse a data dir that
        leased before, whose PIDs above its last lease other controllers may hold."""
        settings = self.settings
        if not settings.pid_source:
            if controller.state.lease_mode:
                raise PidSourceMismatch(
                    "this data dir took its producer ids from etcd leases; without pid_source "
                    "it could grant ids other controllers hold (set pid_source again)"
                )
            return None
        self.metrics.lease_size.set(settings.pid_lease_size)
        return LeaseKeeper(
            etcd_counter(settings, self.metrics.etcd_request),
            controller,
            metalog.wait_durable,
            now,
            lease_size=settings.pid_lease_size,
            prefetch_ratio=settings.pid_lease_prefetch_ratio,
            on_lease=lambda size: self.metrics.leases.inc(),
        )

    async def _expire_transactional_ids(self, controller: Controller) -> None:
        interval = self.settings.transactional_id_cleanup_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            expired = controller.expire_transactional_ids(now())
            if expired:
                log.info("transactional ids expired", count=expired)

    def _initialise_cluster(self, controller: Controller) -> None:
        state, wanted = controller.state, self.settings.cluster_id
        if state.cluster_id is None:
            cluster_id = wanted or new_cluster_id()
            controller.commit([ClusterCreated(cluster_id, self.settings.node_id)], now())
            log.info("cluster created", cluster_id=cluster_id)
        elif wanted is not None and wanted != state.cluster_id:
            raise ClusterIdMismatch(
                f"cluster_id {wanted!r} does not match {state.cluster_id!r} stored in the log"
            )
        controller.commit([ControllerStarted(self.settings.node_id, __version__)], now())

    async def _serve(
        self, controller: Controller, metalog: MetadataLog, task_status: trio.TaskStatus[None]
    ) -> None:
        bound: list[tuple[ListenerSpec, list[trio.SocketListener]]] = []
        self.ports = []
        for index, (protocol, address) in enumerate(self.settings.listener_list):
            tcp = await trio.open_tcp_listeners(address.port, host=address.host)
            port = tcp[0].socket.getsockname()[1]
            self.ports.append(port)
            # advertised_listener names the first listener; the others advertise themselves.
            explicit = self.settings.advertised_listener if index == 0 else None
            host, port = advertised_address(address, port, explicit)
            if index == 0:
                controller.config = dataclasses.replace(
                    controller.config, advertised_host=host, advertised_port=port
                )
            bound.append((ListenerSpec(protocol, host, port), tcp))
        context = None
        if any(spec.tls for spec, _ in bound):
            context = server_ssl_context(self.settings)
        log.info(
            "listening",
            ports=self.ports,
            listeners=[f"{spec.protocol}://{spec.host}:{spec.port}" for spec, _ in bound],
        )
        async with trio.open_nursery() as connections:
            accept_scope = trio.CancelScope()

            async def accept() -> None:
                with accept_scope:
                    async with trio.open_nursery() as acceptors:
                        for spec, tcp in bound:
                            handler = self._connection_handler(controller, metalog, spec, context)
                            acceptors.start_soon(
                                functools.partial(
                                    trio.serve_listeners, handler, tcp, handler_nursery=connections
                                )
                            )

            connections.start_soon(accept)
            self.http.ready = True
            task_status.started()
            await self._stopping.wait()
            self.http.ready = False
            log.info("shutting down", connections=len(self._readers))
            accept_scope.cancel()
            for _, tcp in bound:
                for listener in tcp:
                    await listener.aclose()
            for reader in list(self._readers):
                reader.cancel()
            # In-flight responses get a grace period; whatever is still stuck after it (a
            # client that never reads) is cut off.
            connections.cancel_scope.deadline = (
                trio.current_time() + self.settings.shutdown_grace_ms / 1000
            )

    def _connection_handler(
        self,
        controller: Controller,
        metalog: MetadataLog,
        spec: ListenerSpec,
        context: ssl.SSLContext | None,
    ) -> Callable[[trio.SocketStream], Awaitable[None]]:
        settings = self.settings

        async def handle(tcp: trio.SocketStream) -> None:
            try:
                address, port = tcp.socket.getpeername()[:2]
            except OSError:
                return
            conn = ConnectionInfo(
                peer=f"{address}:{port}", host=address,
                advertised_host=spec.host, advertised_port=spec.port,
            )  # fmt: skip
            stream: trio.abc.Stream = tcp
            refused = self._over_connection_limits(address)
            if refused:
                log.warning("connection refused", peer=conn.peer, reason=refused)
                self.metrics.connections_closed.labels(refused).inc()
                await stream.aclose()
                return
            self._per_address[address] = self._per_address.get(address, 0) + 1
            try:
                if spec.tls and context is not None:
                    tls = trio.SSLStream(tcp, context, server_side=True)
                    with trio.move_on_after(settings.frame_timeout_ms / 1000):
                        try:
                            await tls.do_handshake()
                        except (trio.BrokenResourceError, ssl.SSLError) as e:
                            log.warning("tls handshake failed", peer=conn.peer, reason=str(e))
                            self.metrics.authentication_failures.labels("TLS").inc()
                            await trio.aclose_forcefully(tcp)
                            return
                    certified = principal_from_certificate(tls.getpeercert())
                    if certified and not spec.sasl:
                        conn = dataclasses.replace(conn, principal=certified)
                    stream = tls
                await serve_connection(stream, address, conn)
            except Exception:
                # A bug met by one connection must not take the server down: that
                # connection is closed, the others go on. Nothing half-done can have reached
                # the log (records are checked before they are appended).
                log.exception("connection failed", peer=conn.peer)
                self.metrics.connections_closed.labels("internal_error").inc()
                await trio.aclose_forcefully(tcp)
            finally:
                left = self._per_address[address] - 1
                if left:
                    self._per_address[address] = left
                else:
                    del self._per_address[address]

        async def serve_connection(
            stream: trio.abc.Stream, address: str, conn: ConnectionInfo
        ) -> None:
            delay = self.quotas.connection(address, time.monotonic())
            if delay:
                # KIP-612: over the creation rate, the connection waits before it is served.
                self._throttled("connection", delay)
                await trio.sleep(delay)
            send, receive = trio.open_memory_channel[_Outgoing](
                settings.max_in_flight_per_connection
            )
            reader_scope = trio.CancelScope()
            self._readers.add(reader_scope)
            metrics = self.metrics
            metrics.connections_accepted.inc()
            metrics.connections.inc()
            reason = "client"
            try:
                async with stream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_responses, stream, receive, metalog, nursery)
                    with reader_scope:
                        sasl = SaslSession(
                            tuple(settings.sasl_enabled_mechanisms.split(",")),
                            lambda: self.credentials,
                            active=spec.sasl,
                        )
                        reason = await self._read_requests(stream, send, controller, conn, sasl)
                    if reader_scope.cancelled_caught:
                        reason = "shutdown"
                    await send.aclose()
            finally:
                self._readers.discard(reader_scope)
                metrics.connections.dec()
                metrics.connections_closed.labels(reason).inc()

        return handle

    def _over_connection_limits(self, address: str) -> str | None:
        if len(self._readers) >= self.settings.max_connections:
            return "max_connections"
        if self._per_address.get(address, 0) >= self.settings.max_connections_per_address:
            return "max_connections_per_address"
        return None

    async def _read_requests(
        self,
        stream: trio.abc.Stream,
        send: trio.MemorySendChannel[_Outgoing],
        controller: Controller,
        conn: ConnectionInfo,
        sasl: SaslSession,
    ) -> str:
        """Read, decide and queue requests until the client leaves or must be cut off;
        return why the connection ends (a metric label)."""
        decoder = FrameDecoder(self.settings.max_frame_bytes)
        metrics = self.metrics
        idle_s = self.settings.connections_max_idle_ms / 1000
        frame_s = self.settings.frame_timeout_ms / 1000
        frame_deadline = float("inf")
        while True:
            # Between requests a client may idle up to connections_max_idle_ms; once a frame
            # has begun, all of it must arrive within frame_timeout_ms (no slowloris).
            deadline = frame_deadline if decoder.in_frame else trio.current_time() + idle_s
            with trio.move_on_at(deadline) as waited:
                try:
                    data = await stream.receive_some(RECEIVE_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return "broken"
            if waited.cancelled_caught:
                reason = "frame_timeout" if decoder.in_frame else "idle"
                log.info("closing connection", peer=conn.peer, reason=reason)
                return reason
            if not data:
                return "client"
            metrics.bytes_received.inc(len(data))
            arrived = time.perf_counter()
            was_in_frame = decoder.in_frame
            try:
                frames = decoder.feed(data)
            except FrameError as e:
                log.warning("closing connection", peer=conn.peer, reason=str(e))
                return "frame_too_large"
            if decoder.in_frame and (frames or not was_in_frame):
                frame_deadline = trio.current_time() + frame_s  # a new frame has begun
            for frame in frames:
                try:
                    request = decode_request(frame, controller.supported)
                except UnsupportedApiVersionsVersion as e:
                    body = unsupported_version_response(controller.supported)
                    self._count("api_versions", e.header.api_version, body)
                    await send.send(_Outgoing(encode_response(e.header, body), NO_WAIT))
                    continue
                except ProtocolViolation as e:
                    log.warning("closing connection", peer=conn.peer, reason=str(e))
                    return "protocol_error"
                if request.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
                    outcome = await sasl.handle(request)
                    # Account for the outcome before the answer can reach the client.
                    self._count(api_name(request.api_key), request.api_version, outcome.body)
                    if outcome.principal is not None:
                        conn = dataclasses.replace(conn, principal=outcome.principal)
                        log.info("authenticated", peer=conn.peer, principal=conn.principal,
                                 mechanism=outcome.mechanism)  # fmt: skip
                    if outcome.failure is not None:
                        log.warning(
                            "authentication failed", peer=conn.peer,
                            mechanism=outcome.mechanism, reason=outcome.failure,
                        )  # fmt: skip
                        self.metrics.authentication_failures.labels(
                            outcome.mechanism or "unknown"
                        ).inc()
                    out = encode_response(request.header, outcome.body)
                    await send.send(_Outgoing(out, NO_WAIT, api_name(request.api_key), arrived))
                    if outcome.close:
                        return "authentication_failed"
                    continue
                if not sasl.authenticated and request.api_key not in ALLOWED_BEFORE_AUTHENTICATION:
                    # Kafka: "Unexpected Kafka request ... during SASL handshake": closed.
                    log.warning("request before authentication", peer=conn.peer,
                                api=api_name(request.api_key))  # fmt: skip
                    return "unauthenticated_request"
                reply = controller.handle(request, now(), conn)
                api = api_name(request.api_key)
                body = reply.body
                throttle = self.quotas.request(
                    request.api_key, conn.principal, request.header.client_id, time.monotonic()
                )
                if throttle:
                    body = dataclasses.replace(
                        body, throttle_time=datetime.timedelta(milliseconds=round(throttle * 1000))
                    )
                    self._throttled(api, throttle)
                self._count(api, request.api_version, body)
                if self._log_requests:
                    log.debug(
                        "request", api=api, version=request.api_version, peer=conn.peer,
                        client_id=request.header.client_id,
                        correlation_id=request.header.correlation_id,
                        error=getattr(reply.body, "error_code", 0),
                    )  # fmt: skip
                data_out = encode_response(request.header, body)
                await send.send(_Outgoing(data_out, reply.durable_offset, api, arrived))
                if throttle:
                    # KIP-219: answer at once, then read nothing more from this client until
                    # the throttle time has passed, whether or not it honours the field.
                    await trio.sleep(throttle)

    def _throttled(self, api: str, seconds: float) -> None:
        self.metrics.throttled.labels(api).inc()
        self.metrics.throttle_seconds.labels(api).inc(seconds)

    def _count(self, api: str, version: int, body: object) -> None:
        self.metrics.requests.labels(api, str(version)).inc()
        error = getattr(body, "error_code", ErrorCode.none)
        if error:
            self.metrics.errors.labels(api, str(version), ErrorCode(error).name.upper()).inc()

    async def _write_responses(
        self,
        stream: trio.abc.Stream,
        receive: trio.MemoryReceiveChannel[_Outgoing],
        metalog: MetadataLog,
        nursery: trio.Nursery,
    ) -> None:
        try:
            async for first in receive:
                # Coalesce responses that are already queued into one send.
                batch = [first]
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await metalog.wait_durable(max(item.durable_offset for item in batch))
                data = b"".join(item.data for item in batch)
                await stream.send_all(data)
                self.metrics.bytes_sent.inc(len(data))
                sent = time.perf_counter()
                for item in batch:
                    if item.received:
                        self.metrics.latency.labels(item.api).observe(sent - item.received)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()  # the client is gone; stop reading too

    def _granted(self, record: ProducerIdsGranted) -> None:
        count = record.next_producer_id - record.first_producer_id
        self.metrics.granted(record.holder, record.broker_id, count)
        _log_grant(record)
        if self.lease_keeper is not None:
            self.lease_keeper.poke()


class ClusterIdMismatch(Exception):
    """The configured cluster id differs from the one stored in the log."""


class PidSourceMismatch(Exception):
    """The data dir leased from etcd, and the controller was started without pid_source."""


def build_authorizer(settings: Settings) -> Authorizer:
    super_users = [u.strip() for u in settings.super_users.split(",") if u.strip()]
    return Authorizer(settings.acls, super_users, enabled=settings.authorizer == "acl")


def load_credentials(settings: Settings) -> CredentialStore:
    if not settings.credentials_file:
        return CredentialStore()
    return CredentialStore.load(Path(settings.credentials_file))


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


def _log_grant(record: ProducerIdsGranted) -> None:
    log.info(
        "producer ids granted",
        broker_id=record.broker_id,
        broker_epoch=record.broker_epoch,
        first_producer_id=record.first_producer_id,
        last_producer_id=record.next_producer_id - 1,
        principal=record.principal,
        client_id=record.client_id,
    )


async def serve(settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully; SIGHUP reloads ACLs and
    credentials through ``reload``."""
    server = PidctlServer(settings)
    async with trio.open_nursery() as nursery:

        async def watch_signals() -> None:
            wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            with trio.open_signal_receiver(*wanted) as signals:
                async for signum in signals:
                    log.info("signal received", signal=signal.Signals(signum).name)
                    if signum != signal.SIGHUP:
                        server.request_shutdown()
                        return
                    if reload is not None:
                        try:
                            server.reload(reload())
                        except (ValueError, OSError) as e:
                            log.error("reload failed; the previous configuration stays",
                                      error=str(e))  # fmt: skip

        nursery.start_soon(watch_signals)
        await server.run()
        nursery.cancel_scope.cancel()
