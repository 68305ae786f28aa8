"""Producer-id blocks: KRaft's ProducerIdControlManager.

Owns the high-water mark (no PID at or above it was granted) and the count of blocks
granted. Decides AllocateProducerIds for brokers, for jobs (Spark drivers) and for the
controller's own InitProducerId pool, and an import's raised floor; replays its own
records. Where the next block may start is the configured range's, or with ``pid_source``
the leases' (``pid_leases.py``); a grant past the reservation is preceded by the next one
(``reservations.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.cluster import ClusterControlManager
from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.pid_leases import LeaseManager
from pidctl.controller.core.records import (
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsState,
    Record,
)
from pidctl.controller.core.reservations import ReservationManager
from pidctl.controller.core.result import ControllerResult, answer

#: BrokerId and BrokerEpoch of an AllocateProducerIds sent by a job (a Spark driver), not by
#: a broker: the caller is authorised by IdempotentWrite instead of ClusterAction.
JOB_BROKER_ID: Final = -1
JOB_BROKER_EPOCH: Final = -1
#: AllocateProducerIds' answer while no lease has room (the shared source is unreachable or
#: the next lease is still being taken): retriable, what KRaft answers when it cannot commit.
LEASE_EXHAUSTED: Final = ErrorCode.request_timed_out
#: ErrorCode.none, looked up once (a member read through its enum class costs ~120 ns).
_NO_ERROR: Final = ErrorCode.none
#: Most characters of a client id a grant record keeps (the audit trail's "over which
#: connection"): a client id may be 32,767 bytes, which a client could send with every
#: request to fill the log and push the audit trail out of its retention. A longer one is
#: kept as its first characters and its length; a named job's full key is in its
#: ``JobBlockRecorded``.
MAX_RECORDED_CLIENT_ID_CHARS: Final = 256
_CLIENT_ID_KEPT: Final = MAX_RECORDED_CLIENT_ID_CHARS - 32


def recorded_client_id(client_id: str) -> str:
    """What a grant record keeps of ``client_id``: itself up to
    :data:`MAX_RECORDED_CLIENT_ID_CHARS` characters, else its start and its length."""
    if len(client_id) <= MAX_RECORDED_CLIENT_ID_CHARS:
        return client_id
    return f"{client_id[:_CLIENT_ID_KEPT]}...({len(client_id)} characters)"


@dataclass(frozen=True, slots=True)
class ProducerIdRange:
    """The PIDs this controller may grant, both ends inclusive (settings
    ``first_producer_id`` / ``last_producer_id``), so it can share the space with another
    allocator."""

    first: int = 0
    last: int = INT64_MAX - 1
    #: With ``pid_source``: only PIDs inside leases recorded in the log.
    leased: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last < INT64_MAX:
            raise ValueError(
                f"producer id range [{self.first}, {self.last}] must satisfy "
                f"0 <= first <= last < {INT64_MAX}"
            )


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class Block:
    """AllocateProducerIds' answer: ``ProducerIdStart`` and ``ProducerIdLen`` (0, 0 on error)."""

    error: Final[ErrorCode]
    first: Final[int]
    length: Final[int]

    def __init__(self, error: ErrorCode = ErrorCode.none, first: int = 0, length: int = 0) -> None:
        self.error = error
        self.first = first
        self.length = length


@dataclass(slots=True)
class ProducerIdControlManager:
    """The granted high-water mark; where blocks come from (``leases``, ``reservations``)."""

    cluster: ClusterControlManager = field(compare=False, repr=False)
    leases: LeaseManager = field(compare=False, repr=False)
    reservations: ReservationManager = field(compare=False, repr=False)
    pid_range: ProducerIdRange = field(default_factory=ProducerIdRange, compare=False)
    #: Kafka's "next producer id block" high-water mark: no PID at or above it was granted.
    next_producer_id: int = 0
    blocks_granted: int = 0

    # -- decisions ------------------------------------------------------------------------

    def allocate(
        self,
        *,
        broker_id: int,
        broker_epoch: int,
        principal: str | None = None,
        client_id: str | None = None,
    ) -> ControllerResult[Block]:
        """The next block of :data:`BLOCK_SIZE` PIDs for a registered broker.

        STALE_BROKER_EPOCH for an unknown broker or an epoch other than its current one (a
        fenced broker whose epoch matches still gets its block, as in Kafka);
        UNKNOWN_SERVER_ERROR once the next block would pass the end of the range;
        :data:`LEASE_EXHAUSTED` while no lease has room.
        """
        error = self.cluster.check_broker_epoch(broker_id, broker_epoch)
        if error:
            return answer(Block(error))
        return self._grant(broker_id, broker_epoch, principal, client_id, "broker")

    def allocate_for_job(self, *, principal: str, client_id: str | None) -> ControllerResult[Block]:
        """A block for a job that hands PIDs to its own tasks; the record names who asked."""
        return self._grant(JOB_BROKER_ID, JOB_BROKER_EPOCH, principal, client_id, "job")

    def allocate_for_controller(self, node_id: int) -> ControllerResult[Block]:
        """A block for the controller's own InitProducerId pool: same rules, no epoch."""
        return self._grant(node_id, -1, None, None, "controller")

    def _grant(
        self,
        broker_id: int,
        broker_epoch: int,
        principal: str | None,
        client_id: str | None,
        holder: str,
    ) -> ControllerResult[Block]:
        first = self.next_block_start()
        if first is None:
            return answer(Block(LEASE_EXHAUSTED if self.leased else ErrorCode.unknown_server_error))
        if client_id is not None and len(client_id) > MAX_RECORDED_CLIENT_ID_CHARS:
            client_id = recorded_client_id(client_id)
        end = first + BLOCK_SIZE
        record = ProducerIdsGranted(
            broker_id, broker_epoch, first, end, principal, client_id, holder
        )
        block = Block(_NO_ERROR, first, BLOCK_SIZE)
        reserve = self.reservations.reserve_for(end, self._room(end))
        return ControllerResult((*reserve, record), block)

    def _room(self, end: int) -> int:
        """Where the PIDs that may follow ``end`` end: the range's end, or with leases the
        end of the lease that holds ``end`` (``end`` itself when none does)."""
        return self.leases.room(end) if self.leased else self.pid_range.last + 1

    def raise_floor(self, next_producer_id: int, source: str) -> ControllerResult[None]:
        """Raise the high-water mark (``pidctl import-zk``), reserved first as a grant is."""
        reserve = self.reservations.reserve_for(next_producer_id, next_producer_id)
        return ControllerResult((*reserve, ProducerIdFloorRaised(next_producer_id, source)), None)

    def resume(self, reservation_file: int | None) -> ControllerResult[int]:
        """Start-up, before serving: where grants go on, and the records that say so.

        The log's tail may have lost acknowledged grants that start-up cannot see (a flipped
        bit, a truncation, an emptied segment: all look like a torn write, or like nothing):
        grants go on above the reservation (:meth:`ReservationManager.resume_floor`)."""
        never_reserved = not self.reservations.reserved and not reservation_file
        floor = self.reservations.resume_floor(reservation_file, self._room)
        if floor <= self.next_producer_id:
            return ControllerResult((), self.next_producer_id)
        source = (
            "start-up: a margin above a log from before reservations"
            if never_reserved
            else "start-up: the reservation (the log's tail may have lost grants below it)"
        )
        return ControllerResult(self.raise_floor(floor, source).records, floor)

    # -- queries --------------------------------------------------------------------------

    @property
    def leased(self) -> bool:
        """Grants come only from leases: configured so, or the log ever took one."""
        return self.leases.lease_mode or self.pid_range.leased

    def next_block_start(self) -> int | None:
        """Where the next block starts, or None when no block fits: past the end of the
        range, or (with leases) in no lease held."""
        if self.leased:
            return self.leases.block_start()
        first = max(self.next_producer_id, self.pid_range.first)
        return first if first + BLOCK_SIZE - 1 <= self.pid_range.last else None

    def exhausted(self) -> bool:
        """True when the configured range has no whole block left (without leases): every
        grant is refused until an operator widens the range (``last_producer_id``). With
        leases a controller waits for the next lease instead."""
        return not self.leased and self.next_block_start() is None

    def remaining(self) -> int:
        """How many PIDs can still be granted in whole blocks (with leases: in those held)."""
        if self.leased:
            return self.leases.remaining()
        available = self.pid_range.last - max(self.next_producer_id, self.pid_range.first) + 1
        return max(0, available // BLOCK_SIZE * BLOCK_SIZE)

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply one of this manager's records; checks come before any change. Replayed
        values must strictly increase: a decrease or repeat is corruption."""
        match record:
            case ProducerIdsGranted():
                if record.first_producer_id < self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: grant starts at {record.first_producer_id}, below "
                        f"the high-water mark {self.next_producer_id}"
                    )
                if record.next_producer_id <= record.first_producer_id:
                    raise InvariantViolation(f"offset {offset}: empty or inverted grant")
                self.reservations.check(offset, record.next_producer_id)
                leases = self.leases
                used = 0
                if leases.lease_mode:
                    first, end = record.first_producer_id, record.next_producer_id
                    used = leases.check_grant(offset, first, end)
                self.next_producer_id = record.next_producer_id
                self.blocks_granted += 1
                leases.granted_up_to(self.next_producer_id, used)
            case ProducerIdFloorRaised():
                if record.next_producer_id <= self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: lowers the high-water mark {self.next_producer_id} "
                        f"to {record.next_producer_id}"
                    )
                self.reservations.check(offset, record.next_producer_id)
                self.next_producer_id = record.next_producer_id
                self.leases.granted_up_to(self.next_producer_id)
            case ProducerIdsState():  # (a snapshot's)
                if record.next_producer_id < self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: lowers the high-water mark {self.next_producer_id} "
                        f"to {record.next_producer_id}"
                    )
                self.next_producer_id = record.next_producer_id
                self.blocks_granted = record.blocks_granted
                self.leases.granted_up_to(self.next_producer_id)

    # -- snapshots ------------------------------------------------------------------------

    def copy(
        self,
        cluster: ClusterControlManager,
        leases: LeaseManager,
        reservations: ReservationManager,
    ) -> ProducerIdControlManager:
        return ProducerIdControlManager(
            cluster,
            leases,
            reservations,
            self.pid_range,
            self.next_producer_id,
            self.blocks_granted,
        )

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The high-water mark and count, restated at offset ``at``."""
        yield at, ProducerIdsState(self.next_producer_id, self.blocks_granted)
