"""Start-up, before anything is served: the state recovered from the data dir, and the
records every start writes first (the controller started, the high-water mark above the
reservation, a damaged tail recorded)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import structlog
import trio

from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.datadir import StorageFailed, remove_damaged_tail_file
from pidctl.controller.log.formatting import NotFormatted, state_written_at
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.log.recovery import Recovery, recover
from pidctl.controller.server.after_commit import storage_failed
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.connection import now
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.settings import Settings
from pidctl.protocol import __version__

log: Final = structlog.get_logger("pidctl.server")


class ClusterIdMismatch(PidctlError):
    """The configured cluster id differs from the one stored in the log."""


async def recover_state(
    data_dir: Path, settings: Settings, metrics: Metrics, http: HttpEndpoint
) -> tuple[ControllerState, Recovery]:
    """The data dir read back (in a worker thread), its state configured by ``settings``
    and its clocks started; a storage failure is said as the log says one, and raised."""
    started = time.monotonic()
    try:
        recovery = await trio.to_thread.run_sync(recover, data_dir)
    except StorageFailed as e:  # e.g. truncating a torn tail: named like any other
        storage_failed(http, e)
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
    metrics.recovery_seconds.set(time.monotonic() - started)
    written = state_written_at(data_dir, recovery.snapshot_offset)
    metrics.state_written_at(time.time() if written is None else written)
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
    return state, recovery


async def write_start_up_records(
    quorum: QuorumController, metalog: MetadataLog, settings: Settings, recovery: Recovery
) -> None:
    """The records every start writes before it serves, made durable (the log's writer
    running): the controller started, the high-water mark above the reservation, a
    damaged tail recorded (then its note in the data dir goes)."""
    _initialise_cluster(quorum, settings)
    _resume(quorum, recovery.reservation)
    _record_damaged_tail(quorum, recovery.damaged_tail_bytes)
    await metalog.flush()
    if recovery.damaged_tail_bytes is not None:  # said in the log now: the note goes
        remove_damaged_tail_file(Path(settings.data_dir))


def _initialise_cluster(quorum: QuorumController, settings: Settings) -> None:
    cluster, wanted = quorum.state.cluster, settings.cluster_id
    if cluster.cluster_id is None:  # a log without its first record: made by hand
        raise NotFormatted(
            f"data dir {settings.data_dir} holds no ClusterCreated record: it was not "
            "made by `pidctl format`"
        )
    if wanted is not None and wanted != cluster.cluster_id:
        raise ClusterIdMismatch(
            f"cluster_id {wanted!r} does not match {cluster.cluster_id!r} stored in the log"
        )
    quorum.apply(cluster.controller_started(settings.node_id, __version__), now())


def _resume(quorum: QuorumController, reservation: int | None) -> None:
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


def _record_damaged_tail(quorum: QuorumController, truncated: int | None) -> None:
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
