"""Two-level allocation, pure: when to take a lease from the shared counter, and which range.

A controller with ``pid_source`` grants blocks only from ranges it leased (and recorded in its
own log first). It takes the next lease while less than ``prefetch_ratio`` of a lease is
left, so a lease round trip never stands between a broker and its block.
"""

from __future__ import annotations

from .producer_ids import BLOCK_SIZE, INT64_MAX, ProducerIdRange, remaining_producer_ids
from .state import ControllerState

DEFAULT_LEASE_SIZE = 1_000_000
DEFAULT_PREFETCH_RATIO = 0.5
#: The range of a controller with ``pid_source``: whatever its leases hold.
LEASED = ProducerIdRange(leased=True)


class ProducerIdSpaceExhausted(Exception):
    """The next lease would pass the largest PID Kafka allows."""


def lease_remaining(state: ControllerState) -> int:
    """PIDs still grantable, in whole blocks, from the leases held."""
    return remaining_producer_ids(state, LEASED)


def wants_lease(state: ControllerState, lease_size: int, prefetch_ratio: float) -> bool:
    """True while what is left of the leases held is below the prefetch threshold."""
    return lease_remaining(state) < max(BLOCK_SIZE, lease_size * prefetch_ratio)


def lease_bounds(counter: int, state: ControllerState, lease_size: int) -> tuple[int, int]:
    """The range ``[first, end)`` to lease when the shared counter says ``counter``.

    It starts no lower than this controller's own high-water mark: a data dir that granted
    PIDs before it used etcd (or an etcd that lost its data) must not lease them again.
    """
    first = max(counter, state.high_water())
    end = first + lease_size
    if end > INT64_MAX:
        raise ProducerIdSpaceExhausted(f"a lease at {first} would pass {INT64_MAX}")
    return first, end
