"""AllocateProducerIds decisions: KRaft's ProducerIdControlManager, pure."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from .brokers import check_broker_epoch
from .records import ProducerIdsGranted
from .state import ControllerState

#: Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE; the request carries no size.
BLOCK_SIZE = 1000
#: The largest int64. Kafka never grants it: a block must end strictly below it.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ProducerIdRange:
    """The PIDs this controller may grant, both ends inclusive (settings
    ``first_producer_id`` / ``last_producer_id``), so it can share the space with another
    allocator."""

    first: int = 0
    last: int = INT64_MAX - 1
    #: With ``pid_source``: only PIDs inside leases recorded in the log (``state.leases``).
    leased: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last < INT64_MAX:
            raise ValueError(
                f"producer id range [{self.first}, {self.last}] must satisfy "
                f"0 <= first <= last < {INT64_MAX}"
            )


@dataclass(frozen=True, slots=True)
class Allocation:
    error: ErrorCode
    first_producer_id: int = 0
    length: int = 0
    record: ProducerIdsGranted | None = None


#: AllocateProducerIds' answer while no lease has room (the shared source is unreachable or
#: the next lease is still being taken): retriable, what KRaft answers when it cannot commit.
LEASE_EXHAUSTED = ErrorCode.request_timed_out


def _leased(state: ControllerState, pid_range: ProducerIdRange) -> bool:
    """Grants come only from leases: configured so, or the log ever took one."""
    return state.lease_mode or pid_range.leased


def next_block_start(state: ControllerState, pid_range: ProducerIdRange) -> int | None:
    """Where the next block starts, or None when no block fits: past the end of the range,
    or (with leases) in no lease held."""
    if not _leased(state, pid_range):
        first = max(state.next_producer_id, pid_range.first)
        return first if first + BLOCK_SIZE - 1 <= pid_range.last else None
    for lease in state.leases:
        first = max(state.next_producer_id, lease.first)
        if first + BLOCK_SIZE <= lease.end:
            return first
    return None


def allocate(
    state: ControllerState,
    pid_range: ProducerIdRange,
    *,
    broker_id: int,
    broker_epoch: int,
    principal: str | None = None,
    client_id: str | None = None,
) -> Allocation:
    """Grant the next block of :data:`BLOCK_SIZE` PIDs to a registered broker.

    STALE_BROKER_EPOCH for an unknown broker or an epoch other than its current one (a fenced
    broker whose epoch matches still gets its block, as in Kafka); UNKNOWN_SERVER_ERROR once
    the next block would pass the end of the range; :data:`LEASE_EXHAUSTED` while no lease has
    room. Error responses carry start 0, length 0.
    """
    error = check_broker_epoch(state, broker_id, broker_epoch)
    if error:
        return Allocation(error)
    return _grant(state, pid_range, broker_id, broker_epoch, principal, client_id)


def grant(state: ControllerState, pid_range: ProducerIdRange, *, holder_id: int) -> Allocation:
    """A block for the controller's own InitProducerId pool: same rules, no broker epoch."""
    return _grant(state, pid_range, holder_id, -1, None, None, holder="controller")


#: BrokerId and BrokerEpoch of an AllocateProducerIds sent by a job (a Spark driver), not by
#: a broker: the caller is authorised by IdempotentWrite instead of ClusterAction.
JOB_BROKER_ID = JOB_BROKER_EPOCH = -1


def grant_job(
    state: ControllerState, pid_range: ProducerIdRange, *, principal: str, client_id: str | None
) -> Allocation:
    """A block for a job that hands PIDs to its own tasks; the record names who asked."""
    return _grant(state, pid_range, JOB_BROKER_ID, JOB_BROKER_EPOCH, principal, client_id,
                  holder="job")  # fmt: skip


def _grant(
    state: ControllerState,
    pid_range: ProducerIdRange,
    broker_id: int,
    broker_epoch: int,
    principal: str | None,
    client_id: str | None,
    holder: str = "broker",
) -> Allocation:
    first = next_block_start(state, pid_range)
    if first is None:
        exhausted = LEASE_EXHAUSTED if _leased(state, pid_range) else ErrorCode.unknown_server_error
        return Allocation(exhausted)
    record = ProducerIdsGranted(
        broker_id, broker_epoch, first, first + BLOCK_SIZE, principal, client_id, holder
    )
    return Allocation(ErrorCode.none, first, BLOCK_SIZE, record)


def remaining_producer_ids(state: ControllerState, pid_range: ProducerIdRange) -> int:
    """How many PIDs can still be granted in whole blocks (with leases: in the leases held)."""
    if _leased(state, pid_range):
        blocks = sum(
            max(0, lease.end - max(lease.first, state.next_producer_id)) // BLOCK_SIZE
            for lease in state.leases
        )
        return blocks * BLOCK_SIZE
    available = pid_range.last - max(state.next_producer_id, pid_range.first) + 1
    return max(0, available // BLOCK_SIZE * BLOCK_SIZE)
