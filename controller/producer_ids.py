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


def next_block_start(state: ControllerState, pid_range: ProducerIdRange) -> int:
    return max(state.next_producer_id, pid_range.first)


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
    the next block would pass the end of the range. Error responses carry start 0, length 0.
    """
    error = check_broker_epoch(state, broker_id, broker_epoch)
    if error:
        return Allocation(error)
    return _grant(state, pid_range, broker_id, broker_epoch, principal, client_id)


def grant(state: ControllerState, pid_range: ProducerIdRange, *, holder_id: int) -> Allocation:
    """A block for the controller's own InitProducerId pool: same rules, no broker epoch."""
    return _grant(state, pid_range, holder_id, -1, None, None, holder="controller")


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
    if first + BLOCK_SIZE - 1 > pid_range.last:
        return Allocation(ErrorCode.unknown_server_error)
    record = ProducerIdsGranted(
        broker_id, broker_epoch, first, first + BLOCK_SIZE, principal, client_id, holder
    )
    return Allocation(ErrorCode.none, first, BLOCK_SIZE, record)


def remaining_producer_ids(state: ControllerState, pid_range: ProducerIdRange) -> int:
    """How many PIDs can still be granted in whole blocks."""
    available = pid_range.last - next_block_start(state, pid_range) + 1
    return max(0, available // BLOCK_SIZE * BLOCK_SIZE)
