"""The controller's durable state: one manager per domain, rebuilt by replaying records.

``replay`` is a dispatch: each record type belongs to one manager, which checks it against
its state and applies it. It is the single place state changes, used both live (right after
a decision, before the record is durable) and at recovery, so replaying a log rebuilds
exactly the state that wrote it. Broken invariants are corruption: replay raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pidctl.controller.core.cluster import ClusterControlManager
from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_commits import JobCommitManager
from pidctl.controller.core.jobs import JobAllocationManager
from pidctl.controller.core.producer_ids import ProducerIdControlManager, ProducerIdRange
from pidctl.controller.core.records import (
    BrokerRegistered,
    BrokerUnregistered,
    ClusterCreated,
    ControllerStarted,
    DamagedTailTruncated,
    JobAllocationExpired,
    JobBlockRecorded,
    JobClockAdvanced,
    JobVersionCommitted,
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
    ProducerIdsReserved,
    Record,
    TransactionalIdExpired,
    TransactionalIdUpdated,
)
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.transactions import TransactionControlManager

__all__ = ["ControllerState", "InvariantViolation"]


@dataclass(slots=True)
class ControllerState:
    """Every manager, as of ``next_offset`` (the offset the next record will get)."""

    cluster: ClusterControlManager = field(default_factory=ClusterControlManager)
    producer_ids: ProducerIdControlManager = field(init=False)
    transactions: TransactionControlManager = field(init=False)
    jobs: JobAllocationManager = field(init=False)
    commits: JobCommitManager = field(init=False)
    next_offset: int = 0
    _owners: dict[type, Callable[[int, Any], None]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.producer_ids = ProducerIdControlManager(self.cluster)
        self.transactions = TransactionControlManager(self.producer_ids)
        self.jobs = JobAllocationManager(self.producer_ids)
        self.commits = JobCommitManager(self.jobs)
        self._dispatch()

    def _dispatch(self) -> None:
        cluster, producer_ids, transactions = self.cluster, self.producer_ids, self.transactions
        jobs = self.jobs
        self._owners = {
            ClusterCreated: cluster.replay,
            ControllerStarted: cluster.replay,
            BrokerRegistered: cluster.replay,
            BrokerUnregistered: cluster.replay,
            ProducerIdsGranted: producer_ids.replay,
            ProducerIdsLeased: producer_ids.replay,
            ProducerIdFloorRaised: producer_ids.replay,
            ProducerIdsReserved: producer_ids.replay,
            TransactionalIdUpdated: transactions.replay,
            TransactionalIdExpired: transactions.replay,
            JobBlockRecorded: jobs.replay,
            JobAllocationExpired: self._replay_expired_app,
            JobClockAdvanced: jobs.replay,
            DamagedTailTruncated: self._replay_damaged_tail,
            JobVersionCommitted: self.commits.replay,
        }

    def _replay_expired_app(self, offset: int, record: JobAllocationExpired) -> None:
        # The app id is forgotten with its commit.
        self.jobs.replay(offset, record)
        self.commits.replay(offset, record)

    def _replay_damaged_tail(self, offset: int, record: DamagedTailTruncated) -> None:
        # Both managers' answers may have been in the lost tail.
        self.jobs.replay(offset, record)
        self.transactions.replay(offset, record)

    def configure(
        self,
        *,
        pid_range: ProducerIdRange | None = None,
        node_id: int | None = None,
        session_timeout_ms: int | None = None,
        max_transaction_timeout_ms: int | None = None,
        transactional_id_expiration_ms: int | None = None,
        job_allocation_reuse_ms: int | None = None,
        job_allocation_expiration_ms: int | None = None,
        max_job_app_id_bytes: int | None = None,
        max_job_app_ids_per_principal: int | None = None,
        reservation_size: int | None = None,
    ) -> ControllerState:
        """Set the managers' settings (not part of the durable state); returns self."""
        if pid_range is not None:
            self.producer_ids.pid_range = pid_range
        if node_id is not None:
            self.transactions.node_id = node_id
        if session_timeout_ms is not None:
            self.cluster.sessions.timeout_ms = session_timeout_ms
        if max_transaction_timeout_ms is not None:
            self.transactions.max_timeout_ms = max_transaction_timeout_ms
        if transactional_id_expiration_ms is not None:
            self.transactions.expiration_ms = transactional_id_expiration_ms
        if job_allocation_reuse_ms is not None:
            self.jobs.reuse_ms = job_allocation_reuse_ms
        if job_allocation_expiration_ms is not None:
            self.jobs.expiration_ms = job_allocation_expiration_ms
        if max_job_app_id_bytes is not None:
            self.jobs.max_app_id_bytes = max_job_app_id_bytes
        if max_job_app_ids_per_principal is not None:
            self.jobs.max_app_ids_per_principal = max_job_app_ids_per_principal
        if reservation_size is not None:
            self.producer_ids.reservation_size = reservation_size
        return self

    def replay(self, offset: int, record: Record) -> None:
        """Apply one record at ``offset``; raise :class:`InvariantViolation` if it cannot be."""
        if offset != self.next_offset:
            raise InvariantViolation(f"record at offset {offset}, expected {self.next_offset}")
        if self.cluster.cluster_id is None and not isinstance(record, ClusterCreated):
            raise InvariantViolation(f"offset {offset}: log does not start with ClusterCreated")
        self._owners[type(record)](offset, record)
        self.next_offset = offset + 1

    def damaged_tail(
        self, truncated_bytes: int, wall_ms: int, mono_ms: int
    ) -> ControllerResult[None]:
        """Start-up cut a damaged tail off the log (``docs/log-format.md``): the record that
        says so, from which job versions not in the log are refused for a while and the
        transactional ids updated before it move to new producer ids."""
        running_ms = self.jobs.clock.running_ms(wall_ms, mono_ms)
        updated_ms = self.transactions.transactional_ids.latest_updated_ms()
        record = DamagedTailTruncated(truncated_bytes, running_ms, updated_ms)
        return ControllerResult((record,), None)

    # -- shortcuts used by the log tools, metrics and tests --------------------------------

    @property
    def cluster_id(self) -> str | None:
        return self.cluster.cluster_id

    @property
    def next_producer_id(self) -> int:
        return self.producer_ids.next_producer_id

    # -- snapshots ------------------------------------------------------------------------

    def copy(self) -> ControllerState:
        """A copy that later records do not change (for a snapshot built off the loop)."""
        copied = ControllerState(self.cluster.copy(), next_offset=self.next_offset)
        copied.producer_ids = self.producer_ids.copy(copied.cluster)
        copied.transactions = self.transactions.copy(copied.producer_ids)
        copied.jobs = self.jobs.copy(copied.producer_ids)
        copied.commits = self.commits.copy(copied.jobs)
        copied._dispatch()
        return copied

    def to_snapshot(self) -> dict[str, Any]:
        """A JSON-friendly copy of the whole state: every manager's fields."""
        return {
            **self.cluster.snapshot_fields(),
            **self.producer_ids.snapshot_fields(),
            "next_offset": self.next_offset,
            **self.transactions.snapshot_fields(),
            **self.jobs.snapshot_fields(),
            **self.commits.snapshot_fields(),
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> ControllerState:
        state = cls(ClusterControlManager.from_snapshot(data), next_offset=data["next_offset"])
        state.producer_ids.restore(data)
        state.transactions.restore(data)
        state.jobs.restore(data)
        state.commits.restore(data)
        return state
