"""``pidctl serve``: the rooms started in order, and signals.

Recovers the state from the data dir (``startup.py``), builds the rooms over it
(``rooms.py``), starts the log's writer, writes the start-up records, starts the watch of
the free space (``free_space.py``), the expiries (``expiry.py``), the lease keeper (with
``pid_source``), the listeners and one task per connection (``transport/connection.py``,
admitted by ``transport/admission.py``), and stops them in order on SIGTERM/SIGINT: stop
accepting, stop reading, finish in-flight answers, flush. SIGHUP reloads ACLs and
credentials (``reload.py``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog
import trio

from pidctl.controller.api.handlers import Controller
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.log.datadir import lock_data_dir
from pidctl.controller.log.formatting import check_formatted
from pidctl.controller.log.space import check_room
from pidctl.controller.server.malloc_tuning import pin_mmap_threshold
from pidctl.controller.server.reload import (
    ReloadReader,
    build_authorizer,
    load_credentials,
    reload_refusal,
    restart_only_changes,
)
from pidctl.controller.server.rooms import build_rooms
from pidctl.controller.server.startup import recover_state, write_start_up_records
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.admission import Admission, BoundListener, bind_listeners
from pidctl.controller.server.transport.connection import ConnectionTasks, now
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.server.transport.socket_io import close_socket
from pidctl.controller.settings import ReloadRefused, Settings
from pidctl.protocol import __version__
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.build import BUILD

log: Final = structlog.get_logger("pidctl.server")


class ResourceLimit(PidctlError):
    """The process may not open enough files for the configured connections."""


#: File descriptors kept free beside client and metrics connections: the log's segment,
#: directory and next reservation, a snapshot or roll being written, listeners, etcd,
#: stdio and trio's own.
RESERVED_FILE_DESCRIPTORS: Final = 64


def raise_file_limit(max_connections: int, metrics_max_connections: int = 0) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (soft 1,024 is common) and check that
    ``max_connections`` client and ``metrics_max_connections`` metrics connections fit
    beside the reserve; return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    needed = max_connections + metrics_max_connections + RESERVED_FILE_DESCRIPTORS
    if needed > soft:
        raise ResourceLimit(
            f"max_connections {max_connections} and metrics_max_connections "
            f"{metrics_max_connections} need {needed} file descriptors (with "
            f"{RESERVED_FILE_DESCRIPTORS} reserved) but the limit is {soft} (ulimit -n); "
            "lower them or raise the limit"
        )
    return soft


class PidctlServer:
    """One ``pidctl serve``: its signals and reloads, its listeners, and the serving loop
    over the rooms (``rooms.py``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ports: list[int] = []
        self.metrics = Metrics()
        self.metrics.slow_commit_s = settings.log_inline_sync_max_ms / 1000
        self.quotas = Quotas(
            {
                ApiKey.ALLOCATE_PRODUCER_IDS: settings.allocate_producer_ids_quota,
                ApiKey.INIT_PRODUCER_ID: settings.init_producer_id_quota,
            },
            connection_rate=settings.connection_creation_rate,
            window_s=settings.quota_window_ms / 1000,
            overrides=settings.quota_overrides,
            producer_ids_rate=settings.producer_ids_rate,
            max_buckets=settings.quota_max_buckets,
        )
        self.authorizer = build_authorizer(settings)
        self.credentials = load_credentials(settings)
        self.http = HttpEndpoint(
            self.metrics,
            settings.metrics_max_connections,
            settings.metrics_request_timeout_ms / 1000,
        )
        self._stopping = trio.Event()
        self._controller: Controller | None = None

    async def reload(self, load: Callable[[], Settings], reader: ReloadReader) -> str:
        """SIGHUP: take new ACLs, super users, the authorizer's switch and SASL credentials
        (``reload.py``); nothing else changes, and a reload says which other settings
        changed (they take a restart). Returns the outcome (the label of
        ``pidctl_config_reloads_total``):

        - ``failed``: reading the configuration or the credentials failed or took longer
          than ``reload_timeout_ms``, whatever the error: the previous configuration stays;
        - ``refused``: the new one could be a file caught half written (it ends inside an
          ``[[acls]]`` table, or it would switch the authorizer off, remove a DENY ACL or
          every SASL credential: :func:`reload_refusal`); a reload cannot tell an
          operator's intent from an editor's write in progress, so these take a restart.
          The previous configuration stays;
        - ``applied``."""
        try:
            loaded = await reader.read(load)
        except ReloadRefused as refused:  # (its own name: compiled, a name has one type)
            log.error("reload refused; the previous configuration stays", reason=str(refused))
            return self._reloaded("refused")
        except Exception as e:  # any error: a reload must not take the server down
            log.error(
                "reload failed; the previous configuration stays",
                error=str(e) or type(e).__name__,
            )
            return self._reloaded("failed")
        restart = restart_only_changes(self.settings, loaded.settings)
        authorizer, credentials = loaded.authorizer, loaded.credentials
        reason = reload_refusal(self.authorizer, self.credentials, authorizer, credentials)
        if reason is not None:
            log.error(
                "reload refused; the previous configuration stays",
                reason=reason,
                restart_needed=restart,
            )
            return self._reloaded("refused")
        self.authorizer = authorizer
        self.credentials = credentials
        if self._controller is not None:
            self._controller.authorizer = self.authorizer
        log.info(
            "configuration reloaded",
            acls=len(self.authorizer.acls),
            users=len(self.credentials.users),
            restart_needed=restart,
        )
        if restart:
            log.warning(
                "changed settings take effect only after a restart; the running values stay",
                settings=restart,
            )
        return self._reloaded("applied")

    def _reloaded(self, outcome: str) -> str:
        self.metrics.config_reloads.labels(outcome).inc()
        return outcome

    def request_shutdown(self) -> None:
        """Stop accepting, stop reading, finish in-flight responses, flush, return."""
        self._stopping.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        data_dir = Path(self.settings.data_dir)
        check_formatted(data_dir)  # before anything is created: a wrong path stops here
        log.info("allocator", mmap_threshold_pinned=pin_mmap_threshold())
        settings = self.settings
        limit = raise_file_limit(settings.max_connections, settings.metrics_max_connections)
        log.info("file descriptors", limit=limit)
        lock_fd = lock_data_dir(data_dir)
        try:
            # Before anything is written: a full disk is refused here, in one line, rather
            # than by the first commit's ENOSPC after the server said it was ready.
            free = check_room(data_dir, settings.data_dir_min_free_bytes)
            self.metrics.data_dir_free_bytes.set(free)
            async with trio.open_nursery() as http:
                # Up before recovery, so /healthz answers (and /readyz says 503) meanwhile.
                address = self.settings.metrics_listen
                await self.http.bind(address)
                log.info("metrics listening", address=str(address), port=self.http.port)
                http.start_soon(self.http.serve)
                try:
                    await self._run(data_dir, task_status)
                finally:
                    self.http.ready = False
                    http.cancel_scope.cancel()
        finally:
            os.close(lock_fd)

    async def _run(self, data_dir: Path, task_status: trio.TaskStatus[None]) -> None:
        settings = self.settings
        state, recovery = await recover_state(data_dir, settings, self.metrics, self.http)
        rooms = build_rooms(
            settings,
            state,
            recovery,
            self.metrics,
            self.http,
            self.quotas,
            self.authorizer,
            lambda: self.credentials,
        )
        self._controller = rooms.controller
        metalog, quorum, lease_keeper = rooms.metalog, rooms.quorum, rooms.lease_keeper
        # The rooms, started in order: the log's writer, the records every start writes
        # first, the watch of the free space, the expiries, the lease keeper (a first
        # lease), then the connections until a signal; the log flushed last.
        async with trio.open_nursery() as background:
            await background.start(metalog.run)
            await write_start_up_records(quorum, metalog, settings, recovery)
            if state.producer_ids.exhausted():
                rooms.refusals.no_producer_id("start-up", True)
            await background.start(rooms.free_space.run)
            background.start_soon(rooms.expiry.run)
            if lease_keeper is not None:
                await background.start(lease_keeper.run)
                if state.leases.remaining() == 0:
                    # A first lease before listening, so the first clients are served; a
                    # controller that cannot reach etcd still starts (and answers retriably).
                    with trio.move_on_after(settings.etcd_timeout_ms / 1000):
                        await lease_keeper.leased.wait()
            try:
                await self._serve(rooms.connections, task_status)
                await metalog.flush()
                # Everything granted is durable: the next start need skip nothing.
                quorum.apply(state.reservations.release(), now())
                await metalog.flush()
            finally:
                if lease_keeper is not None:
                    with trio.CancelScope(shield=True):
                        await lease_keeper.counter.aclose()
            background.cancel_scope.cancel()
        log.info("stopped", next_offset=state.next_offset)

    async def _serve(
        self, connections: ConnectionTasks, task_status: trio.TaskStatus[None]
    ) -> None:
        bound = await bind_listeners(self.settings)
        self.ports = [listener.port for listener in bound]
        log.info(
            "listening",
            ports=self.ports,
            listeners=[f"{b.spec.protocol}://{b.spec.host}:{b.spec.port}" for b in bound],
        )
        admission = Admission(self.settings, connections, self.quotas, self.metrics)
        async with trio.open_nursery() as writing:
            # A write the kernel did not take whole is finished beside the connections.
            await writing.start(connections.writer.run)
            await self._serve_connections(connections, admission, bound, writing, task_status)
            writing.cancel_scope.cancel()  # every connection has ended: nothing to finish

    async def _serve_connections(
        self,
        connections: ConnectionTasks,
        admission: Admission,
        bound: list[BoundListener],
        writing: trio.Nursery,
        task_status: trio.TaskStatus[None],
    ) -> None:
        async with trio.open_nursery() as nursery:
            accepting, accepted_last = trio.CancelScope(), trio.Event()

            async def accept() -> None:
                try:
                    with accepting:
                        await admission.accept(bound, nursery)
                finally:
                    accepted_last.set()

            nursery.start_soon(accept)
            watchdog = trio.CancelScope()

            async def watch() -> None:
                with watchdog:
                    await connections.watch()

            nursery.start_soon(watch)
            polling = trio.CancelScope()

            async def poll() -> None:
                with polling:
                    await connections.poll()

            nursery.start_soon(poll)
            self.http.ready = True
            task_status.started()
            await self._stopping.wait()
            self.http.ready = False
            log.info("shutting down", connections=len(connections.live))
            accepting.cancel()
            watchdog.cancel()
            # The listeners are closed once nothing accepts on them any more: an accept
            # already woken runs its batch before the cancel reaches it.
            await accepted_last.wait()
            for listener in bound:
                for sock in listener.sockets:
                    close_socket(sock)
            connections.stop_all()
            polling.cancel()  # after stop_all: no connection parks any more
            # In-flight responses get a grace period; whatever is still stuck after it (a
            # client that never reads) is cut off.
            grace = self.settings.shutdown_grace_ms / 1000
            nursery.cancel_scope.deadline = trio.current_time() + grace
            writing.cancel_scope.deadline = nursery.cancel_scope.deadline


def log_start(settings: Settings) -> None:
    """The first log line of ``pidctl serve``: what starts, where, on which data."""
    log.info(
        "pidctl starting",
        version=__version__,
        build=BUILD,
        pid=os.getpid(),
        node_id=settings.node_id,
        data_dir=str(Path(settings.data_dir).resolve()),
        listeners=[f"{protocol}://{address}" for protocol, address in settings.listener_list],
        metrics=str(settings.metrics_listen),
        pid_source=settings.pid_source or "this controller alone",
    )


async def serve(settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully; SIGHUP reloads ACLs and
    credentials through ``reload`` (until then, ``pidctl serve`` ignores SIGHUP: cli.py)."""
    server = PidctlServer(settings)
    async with trio.open_nursery() as nursery:
        reader = ReloadReader(nursery, settings.reload_timeout_ms / 1000)

        async def watch_signals() -> None:
            wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            with trio.open_signal_receiver(*wanted) as signals:
                async for signum in signals:
                    log.info("signal received", signal=signal.Signals(signum).name)
                    if signum != signal.SIGHUP:
                        server.request_shutdown()
                        return
                    if reload is not None:
                        await server.reload(reload, reader)

        nursery.start_soon(watch_signals)
        await server.run()
        nursery.cancel_scope.cancel()
