"""The rooms of one ``pidctl serve``, built over the recovered state in the order their
collaborators need, each handed what it needs at construction: the log's durable end, the
writers and the after-commit listener before the log that tells them; the log before the
quorum controller that appends to it; the quorum controller's observers (the pool's
grants, the after-commit listener, the lease keeper's bell) before it; the controller, the
lease keeper, the connections, the watch of the free space and the expiries over them.
``app.py`` starts them in order."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Final

import structlog

from pidctl.controller.api.access import RequestLimits
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.pool_grants import for_pool
from pidctl.controller.api.quorum import QuorumController, snapshot_of
from pidctl.controller.core.acl import Authorizer
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.log.recovery import Recovery
from pidctl.controller.server.after_commit import AfterCommit
from pidctl.controller.server.expiry import Expiry
from pidctl.controller.server.fleet.etcd import EtcdCounter
from pidctl.controller.server.fleet.lease_keeper import (
    CounterWentBack,
    GrantBell,
    LeaseKeeper,
    etcd_counter,
)
from pidctl.controller.server.free_space import FreeSpaceWatch
from pidctl.controller.server.refusals import Refusals
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics, StateGauges
from pidctl.controller.server.transport.accounting import Accounting
from pidctl.controller.server.transport.connection import ConnectionLimits, ConnectionTasks, now
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.server.transport.outbox import SocketWriter, StreamWriter
from pidctl.controller.server.transport.poller import Poller
from pidctl.controller.server.transport.poller import available as poller_available
from pidctl.controller.settings import Settings

log: Final = structlog.get_logger("pidctl.server")


class PidSourceMismatch(PidctlError):
    """The data dir leased from etcd, and the controller was started without pid_source."""


class Rooms:
    """What ``pidctl serve`` runs over one recovered state (:func:`build_rooms`)."""

    def __init__(
        self,
        metalog: MetadataLog,
        quorum: QuorumController,
        controller: Controller,
        refusals: Refusals,
        lease_keeper: LeaseKeeper | None,
        connections: ConnectionTasks,
        free_space: FreeSpaceWatch,
        expiry: Expiry,
    ) -> None:
        self.metalog = metalog
        self.quorum = quorum
        self.controller = controller
        self.refusals = refusals
        self.lease_keeper = lease_keeper
        self.connections = connections
        self.free_space = free_space
        self.expiry = expiry


def build_rooms(
    settings: Settings,
    state: ControllerState,
    recovery: Recovery,
    metrics: Metrics,
    http: HttpEndpoint,
    quotas: Quotas,
    authorizer: Authorizer,
    credentials: Callable[[], CredentialStore],
) -> Rooms:
    """The rooms over ``state`` (recovered as ``recovery`` says), none started.
    :class:`PidSourceMismatch` before anything is opened if the data dir leased from etcd
    and ``pid_source`` is not set: its PIDs above its last lease other controllers may
    hold."""
    if state.leases.lease_mode and not settings.pid_source:
        raise PidSourceMismatch(
            "this data dir took its producer ids from etcd leases; without pid_source "
            "it could grant ids other controllers hold (set pid_source again)"
        )
    # Built before the log, as the refusal above: what can still fail (the etcd CA file
    # read) fails with nothing opened yet; after the log, everything is construction.
    counter = (
        etcd_counter(settings, metrics.etcd_request, leases=True) if settings.pid_source else None
    )
    exhausted = Alarm("producer_ids", "no producer id left", http.faults)
    refusals = Refusals(metrics, state, settings.pid_range, exhausted)
    #: Reads the idle plain-TCP connections (transport/poller.py); None without epoll.
    poller = Poller() if poller_available() else None
    # Built before the log, which tells the after-commit listener, which has the writer
    # write what each commit releases: the writers read the log's durable end here.
    durable = DurableOffsets(state.next_offset)
    accounting = Accounting(quotas, metrics, log_requests=settings.log_level == "debug")
    writer = SocketWriter(durable, accounting.sent)
    after_commit = AfterCommit(metrics, http, writer)
    metalog = _metadata_log(settings, state, recovery, after_commit, durable, poller)
    metrics.snapshot_bytes.set(metalog.snapshot_size)  # the one on disk, if any
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
        authorizer=authorizer,
        limits=RequestLimits(
            max_coordinator_keys=settings.max_coordinator_keys,
            max_metadata_topics=settings.max_metadata_topics,
            max_registration_entries=settings.max_registration_entries,
        ),
        on_no_producer_id=refusals.no_producer_id,
        on_paused=refusals.paused,
    )
    lease_keeper = _lease_keeper(settings, quorum, metalog, counter, bell, metrics, http)
    if not authorizer.enabled:
        log.warning(
            "no authorizer: every client may do everything, as Kafka without an authorizer;"
            ' set authorizer = "acl" and acls to restrict'
        )
    metrics.registry.register(StateGauges(state, metrics.grant_rate))
    connections = ConnectionTasks(
        controller,
        accounting,
        writer,
        StreamWriter(durable, accounting.sent),
        metrics,
        credentials,
        _connection_limits(settings),
        poller=poller,
    )
    free_space = FreeSpaceWatch(
        Path(settings.data_dir),
        settings.data_dir_min_free_bytes,
        controller,
        metrics,
        Alarm("disk_space", "data dir nearly full", http.faults),
    )
    expiry = Expiry(
        quorum,
        metalog.wait_durable,
        metrics,
        interval_s=settings.transactional_id_cleanup_interval_ms / 1000,
        batch=settings.transactional_id_expiry_batch,
    )
    return Rooms(
        metalog, quorum, controller, refusals, lease_keeper, connections, free_space, expiry
    )


def _metadata_log(
    settings: Settings,
    state: ControllerState,
    recovery: Recovery,
    listener: AfterCommit,
    durable: DurableOffsets,
    poller: Poller | None,
) -> MetadataLog:
    return MetadataLog(
        Path(settings.data_dir),
        state.next_offset,
        recovery.snapshot_offset,
        partial(snapshot_of, state),  # (the state the quorum controller applies to)
        segment_max_bytes=settings.segment_max_bytes,
        snapshot_interval_records=settings.snapshot_interval_records,
        snapshot_min_interval_s=settings.snapshot_min_interval_ms / 1000,
        retention_bytes=settings.log_retention_bytes,
        retention_ms=settings.log_retention_ms,
        inline_sync_max_s=settings.log_inline_sync_max_ms / 1000,
        preallocate_bytes=settings.log_preallocate_bytes,
        listener=listener,
        durable=durable,
        reservation=recovery.reservation,
        # The server's decision, here: before each commit the poller serves the parked
        # connections readable now, so that requests already received join this commit
        # rather than wait a whole sync for the next (Poller.serve_ready).
        before_commit=None if poller is None else poller.serve_ready,
    )


def _connection_limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        max_frame_bytes=settings.max_frame_bytes,
        idle_timeout_s=settings.connections_max_idle_ms / 1000,
        frame_timeout_s=settings.frame_timeout_ms / 1000,
        max_in_flight=settings.max_in_flight_per_connection,
        sasl_mechanisms=tuple(settings.sasl_enabled_mechanisms.split(",")),
        max_entries_per_round=settings.max_entries_per_round,
        max_unwritten_bytes=settings.max_unwritten_bytes_per_connection,
    )


def _lease_keeper(
    settings: Settings,
    quorum: QuorumController,
    metalog: MetadataLog,
    counter: EtcdCounter | None,
    bell: GrantBell | None,
    metrics: Metrics,
    http: HttpEndpoint,
) -> LeaseKeeper | None:
    """With ``pid_source`` (its ``counter``, and ``bell``, which the quorum controller
    rings): the task that leases from etcd; without, None."""
    if counter is None or bell is None:
        return None
    metrics.lease_size.set(settings.pid_lease_size)

    def counter_went_back(error: CounterWentBack | None) -> None:
        """The etcd counter went back (or is back): counted, and ``/readyz`` fails
        meanwhile."""
        if error is None:
            http.faults.pop("etcd_counter", None)
            return
        metrics.etcd_counter_regressions.inc()
        http.faults["etcd_counter"] = str(error)

    return LeaseKeeper(
        counter,
        quorum,
        metalog.wait_durable,
        now,
        bell,
        lease_size=settings.pid_lease_size,
        prefetch_ratio=settings.pid_lease_prefetch_ratio,
        on_lease=lambda size: metrics.leases.inc(),
        on_counter_went_back=counter_went_back,
    )
