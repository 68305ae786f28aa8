"""Producer-id blocks and leases: KRaft's ProducerIdControlManager, plus two-level allocation.

Owns the high-water mark (no PID at or above it was granted), the blocks granted so far and
the leases held from a shared counter (etcd). Decides AllocateProducerIds for brokers, for
jobs (Spark drivers) and for the controller's own InitProducerId pool, when to take a lease
and which range, and an import's raised floor; replays its own records.

A controller with ``pid_source`` grants blocks only from ranges it leased and recorded in
its own log first, and takes the next lease while less than ``prefetch_ratio`` of a lease is
left, so a lease round trip never stands between a broker and its block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.cluster import ClusterControlManager
from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.records import (
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
    ProducerIdsReserved,
    ProducerIdsState,
    Record,
)
from pidctl.controller.core.result import ControllerResult, answer

DEFAULT_LEASE_SIZE = 1_000_000
#: Default for ``producer_id_reservation``: PIDs reserved ahead of the grants (50,000 blocks).
#: A start-up after a crash skips at most this many (what the log's tail may have granted).
#: Each reservation is one small atomic file write (two fsyncs, a rename and the directory's
#: fsync, ~1.6 ms of the loop here, with its journal commit) that the commit holding it waits
#: for, with every request in it, and the commit after it too: at 5,000 blocks and 15,000
#: grants a second, 3 reservations a second delayed about 0.6 % of durable
#: AllocateProducerIds at 16 x 1 by 1.6 ms, which is the p99's neighbourhood. At 50,000
#: blocks (one every 3 s at that rate, about a snapshot's spacing) the p99 was 0.1-0.2 ms
#: lower in 14 of 22 alternated rounds (medians 2.03 -> 1.82 and 2.96 -> 2.86 ms); at 500
#: blocks 3.56 ms against 2.86 at 5,000. 2^63 PIDs leave room for a crash's skip. With
#: leases, a reservation stops at its lease's end (``_room``): after a crash the rest of that
#: lease is skipped and the next one taken.
DEFAULT_RESERVATION_SIZE = 50_000_000
DEFAULT_PREFETCH_RATIO = 0.5
#: BrokerId and BrokerEpoch of an AllocateProducerIds sent by a job (a Spark driver), not by
#: a broker: the caller is authorised by IdempotentWrite instead of ClusterAction.
JOB_BROKER_ID = JOB_BROKER_EPOCH = -1
#: AllocateProducerIds' answer while no lease has room (the shared source is unreachable or
#: the next lease is still being taken): retriable, what KRaft answers when it cannot commit.
LEASE_EXHAUSTED = ErrorCode.request_timed_out
#: ErrorCode.none, looked up once (a member read through its enum class costs ~120 ns).
_NO_ERROR = ErrorCode.none
#: Most characters of a client id a grant record keeps (the audit trail's "over which
#: connection"): a client id may be 32,767 bytes, which a client could send with every
#: request to fill the log and push the audit trail out of its retention. A longer one is
#: kept as its first characters and its length; a named job's full key is in its
#: ``JobBlockRecorded``.
MAX_RECORDED_CLIENT_ID_CHARS = 256
_CLIENT_ID_KEPT = MAX_RECORDED_CLIENT_ID_CHARS - 32


def recorded_client_id(client_id: str) -> str:
    """What a grant record keeps of ``client_id``: itself up to
    :data:`MAX_RECORDED_CLIENT_ID_CHARS` characters, else its start and its length."""
    if len(client_id) <= MAX_RECORDED_CLIENT_ID_CHARS:
        return client_id
    return f"{client_id[:_CLIENT_ID_KEPT]}...({len(client_id)} characters)"


class ProducerIdSpaceExhausted(Exception):
    """The next lease would pass the largest PID Kafka allows."""


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


@dataclass(frozen=True, slots=True)
class Lease:
    """PIDs ``[first, end)`` leased from the shared source and not yet used up."""

    first: int
    end: int


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final: records.py says why
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
    """The granted high-water mark and the leases held."""

    cluster: ClusterControlManager = field(compare=False, repr=False)
    pid_range: ProducerIdRange = field(default_factory=ProducerIdRange, compare=False)
    #: Kafka's "next producer id block" high-water mark: no PID at or above it was granted.
    next_producer_id: int = 0
    blocks_granted: int = 0
    #: Set by the first lease: from then on every grant must lie inside a lease.
    lease_mode: bool = False
    #: Leases not used up, oldest first; grants come from the first with room.
    leases: list[Lease] = field(default_factory=list)
    #: The last reservation (:class:`ProducerIdsReserved`): nothing at or above it was
    #: granted. 0: this log never reserved (new, or from before reservations).
    reserved: int = 0
    #: The end of the highest lease this log ever took: the shared counter was at least this
    #: high, and a counter seen below it went back (corruption of the shared source).
    highest_lease_end: int = 0
    #: PIDs reserved ahead of the grants at a time (setting ``producer_id_reservation``).
    reservation_size: int = field(default=DEFAULT_RESERVATION_SIZE, compare=False)

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
        record = ProducerIdsGranted(
            broker_id, broker_epoch, first, first + BLOCK_SIZE, principal, client_id, holder
        )
        block = Block(_NO_ERROR, first, BLOCK_SIZE)
        return ControllerResult((*self._reserve_for(first + BLOCK_SIZE), record), block)

    def _reserve_for(self, end: int) -> tuple[Record, ...]:
        """The reservation a grant (or floor) up to ``end`` needs first: none while ``end``
        is within the last one; else the next, ``reservation_size`` beyond ``end`` but not
        past the range (or the lease) ``end`` lies in, so that a restart after a crash still
        has room there."""
        if end <= self.reserved:
            return ()
        return (ProducerIdsReserved(max(end, min(end + self.reservation_size, self._room(end)))),)

    def _room(self, end: int) -> int:
        """Where the PIDs that may follow ``end`` end: the range's end, or with leases the
        end of the lease that holds ``end`` (``end`` itself when none does)."""
        if not self.leased:
            return self.pid_range.last + 1
        return max([end] + [lease.end for lease in self.leases if lease.first < end <= lease.end])

    def wants_lease(self, lease_size: int, prefetch_ratio: float) -> bool:
        """True while what is left of the leases held is below the prefetch threshold."""
        return self.lease_remaining() < max(BLOCK_SIZE, lease_size * prefetch_ratio)

    def lease_bounds(self, counter: int, lease_size: int) -> tuple[int, int]:
        """The range ``[first, end)`` to lease when the shared counter says ``counter``.

        It starts no lower than this controller's own high-water mark: a data dir that
        granted PIDs before it used etcd (or an etcd that lost its data) must not lease them
        again. Raises :class:`ProducerIdSpaceExhausted` past the largest PID.
        """
        first = max(counter, self.high_water())
        end = first + lease_size
        if end > INT64_MAX:
            raise ProducerIdSpaceExhausted(f"a lease at {first} would pass {INT64_MAX}")
        return first, end

    def lease(self, first: int, end: int, source: str, revision: int) -> ControllerResult[None]:
        """Record a lease taken from the shared counter (before any PID of it is granted)."""
        return ControllerResult((ProducerIdsLeased(first, end, source, revision),), None)

    def raise_floor(self, next_producer_id: int, source: str) -> ControllerResult[None]:
        """Raise the high-water mark (``pidctl import-zk``), reserved first as a grant is."""
        reserve = (ProducerIdsReserved(next_producer_id),)
        records = (
            *(reserve if next_producer_id > self.reserved else ()),
            ProducerIdFloorRaised(next_producer_id, source),
        )
        return ControllerResult(records, None)

    def resume(self, reservation_file: int | None) -> ControllerResult[int]:
        """Start-up, before serving: where grants go on, and the records that say so.

        The log's tail may have lost acknowledged grants that start-up cannot see (a flipped
        bit, a truncation, an emptied segment: all look like a torn write, or like nothing).
        Each grant was reserved first, in the reservation file (``reservation_file``) and
        then in the log, so nothing at or above the higher of the two was granted: the
        high-water mark is raised to it. A log that never reserved (written before
        reservations) gets one reservation's margin above its mark instead, the most that
        can be done for it."""
        floor = max(self.reserved, reservation_file or 0)
        if floor == 0 and self.next_producer_id > 0:
            mark = self.next_producer_id
            floor = min(mark + self.reservation_size, self._room(mark))
            source = "start-up: a margin above a log from before reservations"
        else:
            source = "start-up: the reservation (the log's tail may have lost grants below it)"
        if floor <= self.next_producer_id:
            return ControllerResult((), self.next_producer_id)
        return ControllerResult(self.raise_floor(floor, source).records, floor)

    def release_reservation(self) -> ControllerResult[None]:
        """A clean shutdown: every grant is durable, so the reservation comes down to the
        high-water mark and the next start skips nothing."""
        if self.reserved <= self.next_producer_id:
            return ControllerResult((), None)
        return ControllerResult((ProducerIdsReserved(self.next_producer_id),), None)

    # -- queries --------------------------------------------------------------------------

    @property
    def leased(self) -> bool:
        """Grants come only from leases: configured so, or the log ever took one."""
        return self.lease_mode or self.pid_range.leased

    def next_block_start(self) -> int | None:
        """Where the next block starts, or None when no block fits: past the end of the
        range, or (with leases) in no lease held."""
        if not self.leased:
            first = max(self.next_producer_id, self.pid_range.first)
            return first if first + BLOCK_SIZE - 1 <= self.pid_range.last else None
        for lease in self.leases:
            first = max(self.next_producer_id, lease.first)
            if first + BLOCK_SIZE <= lease.end:
                return first
        return None

    def exhausted(self) -> bool:
        """True when the configured range has no whole block left (without leases): every
        grant is refused until an operator widens the range (``last_producer_id``). With
        leases a controller waits for the next lease instead."""
        return not self.leased and self.next_block_start() is None

    def high_water(self) -> int:
        """Nothing at or above this was granted or leased through this log."""
        return max([self.next_producer_id] + [lease.end for lease in self.leases])

    def lease_remaining(self) -> int:
        """PIDs still grantable, in whole blocks, from the leases held."""
        blocks = sum(
            max(0, lease.end - max(lease.first, self.next_producer_id)) // BLOCK_SIZE
            for lease in self.leases
        )
        return blocks * BLOCK_SIZE

    def remaining(self) -> int:
        """How many PIDs can still be granted in whole blocks (with leases: in those held)."""
        if self.leased:
            return self.lease_remaining()
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
                self._check_reserved(offset, record.next_producer_id)
                used = self._lease_of(offset, record) if self.lease_mode else 0
                self.next_producer_id = record.next_producer_id
                self.blocks_granted += 1
                if self.leases:
                    # Leases before the one used are abandoned (their rest is too small).
                    self.leases = [
                        lease for lease in self.leases[used:] if lease.end > self.next_producer_id
                    ]
            case ProducerIdsLeased():
                held_end = self.high_water()
                if record.first_producer_id < held_end:
                    raise InvariantViolation(
                        f"offset {offset}: lease starts at {record.first_producer_id}, below "
                        f"what is already granted or leased ({held_end})"
                    )
                if record.next_producer_id <= record.first_producer_id:
                    raise InvariantViolation(f"offset {offset}: empty or inverted lease")
                self.lease_mode = True
                self.leases.append(Lease(record.first_producer_id, record.next_producer_id))
                self.highest_lease_end = max(self.highest_lease_end, record.next_producer_id)
            case ProducerIdFloorRaised():
                if record.next_producer_id <= self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: lowers the high-water mark {self.next_producer_id} "
                        f"to {record.next_producer_id}"
                    )
                self._check_reserved(offset, record.next_producer_id)
                self.next_producer_id = record.next_producer_id
                self.leases = [
                    lease for lease in self.leases if lease.end > record.next_producer_id
                ]
            case ProducerIdsState():  # (a snapshot's)
                if record.next_producer_id < self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: lowers the high-water mark {self.next_producer_id} "
                        f"to {record.next_producer_id}"
                    )
                self.next_producer_id = record.next_producer_id
                self.blocks_granted = record.blocks_granted
                self.lease_mode = self.lease_mode or record.lease_mode
                self.highest_lease_end = max(self.highest_lease_end, record.highest_lease_end)
                self.leases = [lease for lease in self.leases if lease.end > self.next_producer_id]
            case ProducerIdsReserved():
                if record.next_producer_id < self.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: reserves up to {record.next_producer_id}, below "
                        f"the high-water mark {self.next_producer_id}"
                    )
                self.reserved = record.next_producer_id

    def _check_reserved(self, offset: int, end: int) -> None:
        """Once a log reserves, everything it grants lies below its reservation."""
        if self.reserved and end > self.reserved:
            raise InvariantViolation(
                f"offset {offset}: grants up to {end}, past the reservation {self.reserved}"
            )

    def _lease_of(self, offset: int, record: ProducerIdsGranted) -> int:
        """Index of the held lease the grant lies in; a grant outside every lease is corrupt."""
        for index, lease in enumerate(self.leases):
            if lease.first <= record.first_producer_id and record.next_producer_id <= lease.end:
                return index
        raise InvariantViolation(
            f"offset {offset}: grant [{record.first_producer_id}, {record.next_producer_id}) "
            "lies outside every lease held"
        )

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, cluster: ClusterControlManager) -> ProducerIdControlManager:
        return ProducerIdControlManager(
            cluster,
            self.pid_range,
            self.next_producer_id,
            self.blocks_granted,
            self.lease_mode,
            list(self.leases),
            self.reserved,
            self.highest_lease_end,
            self.reservation_size,
        )

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The manager restated as records at offset ``at``: the leases held, the
        high-water mark with its counts, then the reservation (each replays only after the
        one before it)."""
        for lease in self.leases:
            yield at, ProducerIdsLeased(lease.first, lease.end, "snapshot")
        yield (
            at,
            ProducerIdsState(
                self.next_producer_id, self.blocks_granted, self.highest_lease_end, self.lease_mode
            ),
        )
        if self.reserved:
            yield at, ProducerIdsReserved(self.reserved)
