"""Which log offset an idempotent InitProducerId's answer waits for: its block's grant.

An answer is sent once everything decided before it is durable (``quorum.py``), because it
may report state an earlier, still pending record made. An idempotent InitProducerId reports
only a PID of the controller's own pool (epoch 0) and depends on nothing else the log holds,
so it need wait only for the grant of that PID's block. The difference matters: the pool
asks for its next block when 90% of the current one is used, and with "everything decided
so far" every idempotent answer after that point waited for the prefetch's commit, although
its PID came from a block made durable long before.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from pidctl.controller.core.records import ProducerIdsGranted, Record
from pidctl.controller.core.state import ControllerState

#: The holder of a block of the controller's own pool (``ProducerIdsGranted.holder``).
_CONTROLLER: Final = "controller"


class PoolGrants:
    """The log offsets of the grants of the controller's own pool's blocks, told of every
    record applied (a :class:`~pidctl.controller.api.quorum.QuorumController` observer)."""

    __slots__ = ("_grants",)

    def __init__(self, blocks_held: int) -> None:
        #: (first PID of the block, its end (exclusive), offset of its grant), in the order
        #: granted, which is the order of the PIDs; no more than the pool holds blocks (the
        #: pool may be used by transactional ids only, which never look a grant up here).
        self._grants: deque[tuple[int, int, int]] = deque(maxlen=blocks_held)

    def applied(self, offset: int, record: Record) -> None:
        """Note the offset of a grant to the controller's pool."""
        if isinstance(record, ProducerIdsGranted) and record.holder == _CONTROLLER:
            grant = (record.first_producer_id, record.next_producer_id, offset)
            self._grants.append(grant)

    def offset_of(self, producer_id: int, otherwise: int) -> int:
        """The offset of the grant of the block holding ``producer_id``: what its answer
        waits for. ``otherwise`` (everything decided so far) for a PID of no grant noted."""
        grants = self._grants
        # The pool hands out PIDs in order: the grants of blocks below this PID are done with.
        while grants and grants[0][1] <= producer_id:
            grants.popleft()
        if not grants or producer_id < grants[0][0]:
            return otherwise
        return grants[0][2]


def for_pool(state: ControllerState) -> PoolGrants:
    """The grants of ``state``'s pool: as many as it holds blocks, and the one it asks for
    next. Hand its ``applied`` to the quorum controller as an observer, and it to the
    :class:`~pidctl.controller.api.handlers.Controller`."""
    return PoolGrants(blocks_held=state.transactions.pool.depth + 1)
