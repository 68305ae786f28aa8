"""``pidctl serve``: wiring and signals.

Recovers the state from the data dir, builds the controller over it, starts the log's writer,
the lease keeper (with ``pid_source``), the transactional-id expiry, the listeners and one
task per connection (``transport/connection.py``, admitted by ``transport/admission.py``),
and stops them in order on SIGTERM/SIGINT: stop accepting, stop reading, finish in-flight
answers, flush.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from pidctl.controller.api.handlers import Controller, RequestLimits
from pidctl.controller.api.pool_grants import for_pool
from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.datadir import (
    StorageFailed,
    lock_data_dir,
    remove_damaged_tail_file,
)
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.log.formatting import NotFormatted, check_formatted, state_written_at
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.log.recovery import recover
from pidctl.controller.log.space import SpaceVerdict, check_room, free_bytes
from pidctl.controller.server.after_commit import AfterCommit, storage_failed
from pidctl.controller.server.fleet.lease_keeper import (
    CounterWentBack,
    GrantBell,
    LeaseKeeper,
    etcd_counter,
)
from pidctl.controller.server.malloc_tuning import pin_mmap_threshold
from pidctl.controller.server.reload import (
    ReloadReader,
    build_authorizer,
    load_credentials,
    reload_refusal,
    restart_only_changes,
)
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics, StateView
from pidctl.controller.server.transport.admission import Admission, BoundListener, bind_listeners
from pidctl.controller.server.transport.connection import ConnectionLimits, ConnectionTasks, now
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.server.transport.outbox import SocketWriter, StreamWriter
from pidctl.controller.server.transport.poller import Poller
from pidctl.controller.server.transport.poller import available as poller_available
from pidctl.controller.server.transport.sent import AnswersSent
from pidctl.controller.server.transport.socket_io import close_socket
from pidctl.controller.settings import ReloadRefused, Settings
from pidctl.protocol import __version__
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.build import BUILD

log = structlog.get_logger("pidctl.server")


class ClusterIdMismatch(PidctlError):
    """The configured cluster id differs from the one stored in the log."""


class PidSourceMismatch(PidctlError):
    """The data dir leased from etcd, and the controller was started without pid_source."""


class ResourceLimit(PidctlError):
    """The process may not open enough files for the configured connections."""


#: File descriptors kept free beside client and metrics connections: the log's segment,
#: directory and next reservation, a snapshot or roll being written, listeners, etcd,
#: stdio and trio's own.
RESERVED_FILE_DESCRIPTORS = 64
#: How often the data dir's free space is looked at while serving (one statvfs, in a
#: worker thread): below data_dir_min_free_bytes grants pause within this long.
FREE_SPACE_CHECK_S = 1.0


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
    """Owns the metadata log, the controller and the listeners of one ``pidctl serve``."""

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
        self._exhausted = Alarm("producer_ids", "no producer id left", self.http.faults)
        self._low_space = Alarm("disk_space", "data dir nearly full", self.http.faults)
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
        started = time.monotonic()
        try:
            recovery = await trio.to_thread.run_sync(recover, data_dir)
        except StorageFailed as e:  # e.g. truncating a torn tail: named like any other
            storage_failed(self.http, e)
            raise
        state = recovery.state.configure(
            pid_range=settings.pid_range,
            node_id=settings.node_id,
            session_timeout_ms=settings.broker_session_timeout_ms,
            max_transaction_timeout_ms=settings.transaction_max_timeout_ms,
            transactional_id_expiration_ms=settings.transactional_id_expiration_ms,
            job_allocation_reuse_ms=settings.job_allocation_reuse_ms,
            job_allocation_expiration_ms=settings.job_allocation_expiration_ms,
            max_job_app_id_bytes=settings.max_job_app_id_bytes,
            max_job_app_ids_per_principal=settings.max_job_app_ids_per_principal,
            reservation_size=settings.producer_id_reservation,
        )
        clocks = now()
        state.cluster.restore_sessions(clocks.mono_ms)
        state.jobs.start(clocks.wall_ms, clocks.mono_ms)
        self.metrics.recovery_seconds.set(time.monotonic() - started)
        written = state_written_at(data_dir, recovery.snapshot_offset)
        self.metrics.state_written_at(time.time() if written is None else written)
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
        #: Reads the idle plain-TCP connections (transport/poller.py); None without epoll.
        poller = Poller() if poller_available() else None
        # Built before the log, which tells the after-commit listener, which has the writer
        # write what each commit releases: the writers read the log's durable end here.
        durable = DurableOffsets(state.next_offset)
        sent = AnswersSent(self.metrics)
        writer = SocketWriter(durable, sent.sent)
        after_commit = AfterCommit(self.metrics, self.http, writer)
        metalog = MetadataLog(
            data_dir,
            state.next_offset,
            recovery.snapshot_offset,
            lambda: quorum.snapshot(),  # (the quorum controller, made below over this log)
            segment_max_bytes=settings.segment_max_bytes,
            snapshot_interval_records=settings.snapshot_interval_records,
            snapshot_min_interval_s=settings.snapshot_min_interval_ms / 1000,
            retention_bytes=settings.log_retention_bytes,
            retention_ms=settings.log_retention_ms,
            inline_sync_max_s=settings.log_inline_sync_max_ms / 1000,
            preallocate_bytes=settings.log_preallocate_bytes,
            listener=after_commit,
            durable=durable,
            reservation=recovery.reservation,
            # The server's decision, here: before each commit the poller serves the parked
            # connections readable now, so that requests already received join this commit
            # rather than wait a whole sync for the next (Poller.serve_ready).
            before_commit=None if poller is None else poller.serve_ready,
        )
        self.metrics.snapshot_bytes.set(metalog.snapshot_size)  # the one on disk, if any
        limits = RequestLimits(
            max_coordinator_keys=settings.max_coordinator_keys,
            max_metadata_topics=settings.max_metadata_topics,
            max_registration_entries=settings.max_registration_entries,
        )
        pool_grants = for_pool(state)
        # Rung by each grant while a lease keeper (pid_source) waits for it.
        bell = GrantBell() if settings.pid_source else None
        leases = () if bell is None else (bell.applied,)
        observers = (pool_grants.applied, after_commit.applied, *leases)
        quorum = QuorumController(state, metalog, observers)
        controller = Controller(
            quorum,
            pool_grants=pool_grants,
            node_id=settings.node_id,
            authorizer=self.authorizer,
            limits=limits,
            on_no_producer_id=self._no_producer_id,
            on_paused=self._refused_while_paused,
        )
        self._controller = controller
        lease_keeper = self._lease_keeper(quorum, metalog, bell)
        if not self.authorizer.enabled:
            log.warning(
                "no authorizer: every client may do everything, as Kafka without an authorizer;"
                ' set authorizer = "acl" and acls to restrict'
            )
        self.metrics.state_view = _state_view(state)
        connections = ConnectionTasks(
            controller,
            writer,
            StreamWriter(durable, sent.sent),
            self.quotas,
            self.metrics,
            lambda: self.credentials,
            ConnectionLimits(
                max_frame_bytes=settings.max_frame_bytes,
                idle_timeout_s=settings.connections_max_idle_ms / 1000,
                frame_timeout_s=settings.frame_timeout_ms / 1000,
                max_in_flight=settings.max_in_flight_per_connection,
                sasl_mechanisms=tuple(settings.sasl_enabled_mechanisms.split(",")),
                max_entries_per_round=settings.max_entries_per_round,
                max_unwritten_bytes=settings.max_unwritten_bytes_per_connection,
            ),
            log_requests=settings.log_level == "debug",
            poller=poller,
        )
        async with trio.open_nursery() as background:
            await background.start(metalog.run)
            self._initialise_cluster(quorum)
            self._resume(quorum, recovery.reservation)
            self._record_damaged_tail(quorum, recovery.damaged_tail_bytes)
            await metalog.flush()
            if recovery.damaged_tail_bytes is not None:  # said in the log now: the note goes
                remove_damaged_tail_file(data_dir)
            if state.producer_ids.exhausted():
                self._no_producer_id("start-up", True)
            await background.start(self._watch_free_space, data_dir)
            background.start_soon(self._expire_transactional_ids, quorum, metalog)
            if lease_keeper is not None:
                await background.start(lease_keeper.run)
                if state.leases.remaining() == 0:
                    # A first lease before listening, so the first clients are served; a
                    # controller that cannot reach etcd still starts (and answers retriably).
                    with trio.move_on_after(settings.etcd_timeout_ms / 1000):
                        await lease_keeper.leased.wait()
            try:
                await self._serve(connections, task_status)
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

    def _no_producer_id(self, api: str, exhausted: bool) -> None:
        """A request refused for want of a producer id: counted; a used-up range also
        fails ``/readyz`` and is logged (at once, then at most every 10 s)."""
        if api != "start-up":
            self.metrics.producer_id_refusals.labels(
                api, "exhausted" if exhausted else "waiting"
            ).inc()
        if not exhausted:
            return
        state = self._controller.state if self._controller is not None else None
        pid_range = self.settings.pid_range
        self._exhausted.sound(
            f"the producer id range is used up (no block of 1000 fits below last_producer_id "
            f"{pid_range.last}): InitProducerId is answered COORDINATOR_LOAD_IN_PROGRESS and "
            "AllocateProducerIds UNKNOWN_SERVER_ERROR until last_producer_id is raised",
            refused=api,
            next_producer_id=None if state is None else state.next_producer_id,
        )

    def _refused_while_paused(self, api: str) -> None:
        self.metrics.producer_id_refusals.labels(api, "disk_space").inc()

    async def _watch_free_space(
        self, data_dir: Path, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The data dir's free space, every ``FREE_SPACE_CHECK_S``: a gauge, and below
        ``data_dir_min_free_bytes`` grants pause (``Controller.paused``: retriable errors,
        nothing written), ``/readyz`` fails, and the log says why, before a commit meets
        ENOSPC (which stops the server); they resume once there is room again."""
        minimum = self.settings.data_dir_min_free_bytes
        while True:
            free = await trio.to_thread.run_sync(free_bytes, data_dir)
            self.metrics.data_dir_free_bytes.set(free)
            problem = SpaceVerdict(free, minimum).problem
            if problem is None:
                self._low_space.clear(free_bytes=free, grants="resumed")
            else:
                self._low_space.sound(
                    problem,
                    data_dir=str(data_dir),
                    free_bytes=free,
                    grants="paused: InitProducerId answered COORDINATOR_LOAD_IN_PROGRESS, "
                    "AllocateProducerIds KAFKA_STORAGE_ERROR, until there is room",
                )
            if self._controller is not None:
                self._controller.paused = problem
            self.metrics.grants_paused.set(0 if problem is None else 1)
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(FREE_SPACE_CHECK_S)

    def _lease_keeper(
        self, quorum: QuorumController, metalog: MetadataLog, bell: GrantBell | None
    ) -> LeaseKeeper | None:
        """With ``pid_source`` (and ``bell``, which the quorum controller rings): the task
        that leases from etcd. Without: refuse a data dir that leased before, whose PIDs
        above its last lease other controllers may hold."""
        settings = self.settings
        if bell is None:
            if quorum.state.leases.lease_mode:
                raise PidSourceMismatch(
                    "this data dir took its producer ids from etcd leases; without pid_source "
                    "it could grant ids other controllers hold (set pid_source again)"
                )
            return None
        self.metrics.lease_size.set(settings.pid_lease_size)
        return LeaseKeeper(
            etcd_counter(settings, self.metrics.etcd_request, leases=True),
            quorum,
            metalog.wait_durable,
            now,
            lease_size=settings.pid_lease_size,
            prefetch_ratio=settings.pid_lease_prefetch_ratio,
            on_lease=lambda size: self.metrics.leases.inc(),
            on_counter_went_back=self._counter_went_back,
            bell=bell,
        )

    def _counter_went_back(self, error: CounterWentBack | None) -> None:
        """The etcd counter went back (or is back): counted, and ``/readyz`` fails meanwhile."""
        if error is None:
            self.http.faults.pop("etcd_counter", None)
            return
        self.metrics.etcd_counter_regressions.inc()
        self.http.faults["etcd_counter"] = str(error)

    async def _expire_transactional_ids(
        self, quorum: QuorumController, metalog: MetadataLog
    ) -> None:
        """Every cleanup interval, expire what is due in steps of at most
        ``transactional_id_expiry_batch`` ids (Kafka's TransactionStateManager removes expired
        ids in batches too): each step costs what it expires, and the next one waits until
        it is durable, so the requests decided meanwhile share the log with it instead of
        queueing behind every expiry at once."""
        interval = self.settings.transactional_id_cleanup_interval_ms / 1000
        batch = self.settings.transactional_id_expiry_batch
        while True:
            await trio.sleep(interval)
            total = steps = 0
            longest = 0.0  # the event loop's CPU time in one step: what a request waits behind
            while True:
                started = time.thread_time()
                expired, offset = quorum.expire_transactional_ids(now(), batch)
                longest = max(longest, time.thread_time() - started)
                total += expired
                steps += 1
                self.metrics.transactional_ids_expired.inc(expired)
                if expired < batch:
                    break
                await metalog.wait_durable(offset)
                await trio.lowlevel.checkpoint()  # (durable already: other work first all the same)
            if total:
                log.info(
                    "transactional ids expired",
                    count=total,
                    steps=steps,
                    longest_step_cpu_ms=round(longest * 1000, 3),
                )
            # Job app ids past job_allocation_expiration_ms, the same way.
            total = 0
            while True:
                expired, offset = quorum.expire_job_allocations(now(), batch)
                total += expired
                if expired < batch:
                    break
                await metalog.wait_durable(offset)
            if total:
                log.info("job allocations expired", count=total)

    def _resume(self, quorum: QuorumController, reservation: int | None) -> None:
        """Raise the high-water mark above whatever the log's tail may have lost (the
        reservation), before anything is served."""
        producer_ids = quorum.state.producer_ids
        before = producer_ids.next_producer_id
        floor, _ = quorum.apply(producer_ids.resume(reservation), now())
        if floor > before:
            log.warning(
                "producer ids go on above the reservation",
                next_producer_id_in_log=before,
                next_producer_id=floor,
                skipped=floor - before,
                reason="the log's tail may have lost grants below it (a crash, or damage)",
            )

    def _record_damaged_tail(self, quorum: QuorumController, truncated: int | None) -> None:
        """Start-up cut a damaged tail (now, or in a start-up that stopped before saying so):
        recorded before anything is served, so that what the lost records answered is
        refused or moved past rather than answered anew (docs/log-format.md)."""
        if truncated is None:
            return
        moment = now()
        quorum.apply(quorum.state.damaged_tail(truncated, moment.wall_ms, moment.mono_ms), moment)
        log.warning(
            "damaged tail recorded",
            truncated_bytes=truncated,
            note="job versions not in the log are refused for job_allocation_reuse_ms, and "
            "transactional ids updated before it move to new producer ids",
        )

    def _initialise_cluster(self, quorum: QuorumController) -> None:
        cluster, wanted = quorum.state.cluster, self.settings.cluster_id
        if cluster.cluster_id is None:  # a log without its first record: made by hand
            raise NotFormatted(
                f"data dir {self.settings.data_dir} holds no ClusterCreated record: it was not "
                "made by `pidctl format`"
            )
        if wanted is not None and wanted != cluster.cluster_id:
            raise ClusterIdMismatch(
                f"cluster_id {wanted!r} does not match {cluster.cluster_id!r} stored in the log"
            )
        quorum.apply(cluster.controller_started(self.settings.node_id, __version__), now())


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


def _state_view(state: ControllerState) -> StateView:
    cluster, producer_ids, leases = state.cluster, state.producer_ids, state.leases
    return StateView(
        next_producer_id=lambda: producer_ids.next_producer_id,
        remaining_producer_ids=producer_ids.remaining,
        registered_brokers=lambda: len(cluster.brokers),
        fenced_brokers=lambda: sum(
            cluster.is_fenced(b, now().mono_ms) for b in list(cluster.brokers)
        ),
        transactional_ids=lambda: len(state.transactions.transactional_ids),
        lease_remaining=leases.remaining,
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
