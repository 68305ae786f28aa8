"""The controller's durable state: one manager per domain, rebuilt by replaying records.

``replay`` is a dispatch: each record type belongs to one manager, which checks it against
its state and applies it. It is the single place state changes, used both live (right after
a decision, before the record is durable) and at recovery, so replaying a log rebuilds
exactly the state that wrote it. Broken invariants are corruption: replay raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pidctl.controller.core.cluster import ClusterControlManager
from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_commits import JobCommitManager
from pidctl.controller.core.jobs import JobAllocationManager
from pidctl.controller.core.pid_leases import LeaseManager
from pidctl.controller.core.producer_ids import ProducerIdControlManager, ProducerIdRange
from pidctl.controller.core.records import (
    SNAPSHOT_RECORDS,
    BrokerRegistered,
    BrokerUnregistered,
    ClusterCreated,
    ControllerStarted,
    DamagedTailTruncated,
    JobAllocationExpired,
    JobAllocationsLoaded,
    JobBlockRecorded,
    JobClockAdvanced,
    JobCommitsLoaded,
    JobsState,
    JobVersionCommitted,
    LeasesState,
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
    ProducerIdsReserved,
    ProducerIdsState,
    Record,
    TransactionalIdExpired,
    TransactionalIdsLoaded,
    TransactionalIdUpdated,
    TransactionsState,
    record_name,
)
from pidctl.controller.core.reservations import ReservationManager
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.transactions import TransactionControlManager

__all__ = ["ControllerState", "InvariantViolation"]


@dataclass(slots=True)
class ControllerState:
    """Every manager, as of ``next_offset`` (the offset the next record will get)."""

    cluster: ClusterControlManager = field(default_factory=ClusterControlManager)
    leases: LeaseManager = field(init=False)
    reservations: ReservationManager = field(init=False)
    producer_ids: ProducerIdControlManager = field(init=False)
    transactions: TransactionControlManager = field(init=False)
    jobs: JobAllocationManager = field(init=False)
    commits: JobCommitManager = field(init=False)
    next_offset: int = 0
    _owners: dict[type, Callable[[int, Any], None]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.leases = LeaseManager(self._granted)
        self.reservations = ReservationManager(self._granted)
        self.producer_ids = ProducerIdControlManager(self.cluster, self.leases, self.reservations)
        self.transactions = TransactionControlManager(self.producer_ids)
        self.jobs = JobAllocationManager(self.producer_ids)
        self.commits = JobCommitManager(self.jobs)
        self._dispatch()

    def _granted(self) -> int:
        """The high-water mark, for the leases' and reservations' checks."""
        return self.producer_ids.next_producer_id

    def _dispatch(self) -> None:
        cluster, producer_ids, transactions = self.cluster, self.producer_ids, self.transactions
        leases, reservations, jobs = self.leases, self.reservations, self.jobs
        self._owners = {
            ClusterCreated: cluster.replay,
            ControllerStarted: cluster.replay,
            BrokerRegistered: cluster.replay,
            BrokerUnregistered: cluster.replay,
            ProducerIdsGranted: producer_ids.replay,
            ProducerIdsLeased: leases.replay,
            ProducerIdFloorRaised: producer_ids.replay,
            ProducerIdsReserved: reservations.replay,
            TransactionalIdUpdated: transactions.replay,
            TransactionalIdExpired: transactions.replay,
            JobBlockRecorded: jobs.replay,
            JobAllocationExpired: self._replay_expired_app,
            JobClockAdvanced: jobs.replay,
            DamagedTailTruncated: self._replay_damaged_tail,
            JobVersionCommitted: self.commits.replay,
            # Only in snapshots (records.py says why):
            ProducerIdsState: producer_ids.replay,
            LeasesState: leases.replay,
            TransactionalIdsLoaded: transactions.replay,
            TransactionsState: transactions.replay,
            JobAllocationsLoaded: jobs.replay,
            JobsState: jobs.replay,
            JobCommitsLoaded: self.commits.replay,
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
            self.reservations.reservation_size = reservation_size
        return self

    def replay(self, offset: int, record: Record) -> None:
        """Apply one record at ``offset``; raise :class:`InvariantViolation` if it cannot be."""
        if offset != self.next_offset:
            raise InvariantViolation(f"record at offset {offset}, expected {self.next_offset}")
        if self.cluster.cluster_id is None and not isinstance(record, ClusterCreated):
            raise InvariantViolation(f"offset {offset}: log does not start with ClusterCreated")
        if type(record) in SNAPSHOT_RECORDS:
            raise InvariantViolation(f"offset {offset}: a snapshot's {record_name(record)}")
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
        copied.leases = self.leases.copy(copied._granted)
        copied.reservations = self.reservations.copy(copied._granted)
        copied.producer_ids = self.producer_ids.copy(
            copied.cluster, copied.leases, copied.reservations
        )
        copied.transactions = self.transactions.copy(copied.producer_ids)
        copied.jobs = self.jobs.copy(copied.producer_ids)
        copied.commits = self.commits.copy(copied.jobs)
        copied._dispatch()
        return copied

    def snapshot_records(self) -> Iterator[tuple[int, Record]]:
        """The whole state restated as records, with the offset each stands at (``cluster``:
        where its record was written; the rest: :attr:`next_offset`, the state they restate),
        in an order :meth:`from_snapshot_records` replays: every manager's own, as Kafka's
        managers write snapshots."""
        if self.cluster.cluster_id is None:
            return  # (a log not begun: nothing to restate)
        at = self.next_offset
        yield from self.cluster.snapshot_records()
        yield from self.leases.snapshot_records(at)
        yield from self.producer_ids.snapshot_records(at)
        yield from self.reservations.snapshot_records(at)
        yield from self.transactions.snapshot_records(at)
        yield from self.jobs.snapshot_records(at)
        yield from self.commits.snapshot_records(at)

    @classmethod
    def from_snapshot_records(
        cls, next_offset: int, records: Iterable[tuple[int, Record]]
    ) -> ControllerState:
        """The state a snapshot at ``next_offset`` holds, its records replayed by each
        manager's ``replay`` (as the log's are); :class:`InvariantViolation` if one breaks
        an invariant."""
        state = cls(next_offset=next_offset)
        owners = state._owners
        for offset, record in records:
            if state.cluster.cluster_id is None and not isinstance(record, ClusterCreated):
                raise InvariantViolation("a snapshot that does not start with ClusterCreated")
            owners[type(record)](offset, record)
        return state
