"""The one producer-id block pool, pure: KIP-730's broker side of a block grant.

A holder of blocks (the controller's own InitProducerId path, a broker, a Spark driver)
keeps the current block plus ``depth`` more, asks for the next once ``threshold`` of the
current one is used (Kafka's RPCProducerIdManager: 90%), and refuses a granted block that
overlaps what it holds, is negative or overflows. Asking and waiting are the caller's.
"""

from __future__ import annotations

import math
from collections import deque

from pidctl.controller.core.kafka import INT64_MAX, PREFETCH_THRESHOLD


class InvalidBlock(ValueError):
    """A granted block overlaps the pool, is negative or overflows."""


class _Block:
    __slots__ = ("end", "next", "refill_at")

    def __init__(self, first: int, end: int, threshold: float) -> None:
        self.next = first
        self.end = end  # exclusive
        #: The first ``next`` at which ``threshold`` of the block is used (used >= threshold
        #: * size, used an int): worked out once, not at every take.
        self.refill_at = first + math.ceil(threshold * (end - first))


class ProducerIdPool:
    """Blocks held, oldest first; PIDs are taken from the oldest."""

    __slots__ = ("_blocks", "_highest_end", "depth", "threshold")

    def __init__(self, threshold: float = PREFETCH_THRESHOLD, depth: int = 1) -> None:
        if not 0 < threshold <= 1 or depth < 1:
            raise ValueError("threshold in (0, 1], depth >= 1")
        self.threshold = threshold
        self.depth = depth
        self._blocks: deque[_Block] = deque()
        self._highest_end = -1

    @property
    def remaining(self) -> int:
        """PIDs held and not yet taken."""
        return sum(b.end - b.next for b in self._blocks)

    @property
    def blocks_ahead(self) -> int:
        """Blocks held beyond the current one."""
        self._drop_used()
        return max(0, len(self._blocks) - 1)

    def wants_block(self) -> bool:
        """True with no block, or with fewer than ``depth`` ahead once ``threshold`` of the
        current one is used."""
        self._drop_used()
        if not self._blocks:
            return True
        if len(self._blocks) - 1 >= self.depth:
            return False
        return self._blocks[0].next >= self._blocks[0].refill_at

    def add_block(self, first: int, length: int) -> None:
        """Hold a granted block ``[first, first + length)``; raises :class:`InvalidBlock`."""
        if first < 0 or length <= 0 or first > INT64_MAX - length:
            raise InvalidBlock(f"block [{first}, +{length}) is negative or overflows")
        if first < self._highest_end:
            raise InvalidBlock(
                f"block at {first} overlaps the current one (ends {self._highest_end})"
            )
        self._blocks.append(_Block(first, first + length, self.threshold))
        self._highest_end = first + length

    def clear(self) -> None:
        """Drop every block held (their PIDs are never handed out)."""
        self._blocks.clear()

    def take(self) -> int | None:
        """The next PID, or None when the pool is empty."""
        self._drop_used()
        if not self._blocks:
            return None
        block = self._blocks[0]
        pid = block.next
        block.next = pid + 1
        return pid

    def take_run(self, most: int) -> range:
        """Up to ``most`` PIDs of the current block: what :meth:`take` would give if called
        ``most`` times, the first at once and each later one only while :meth:`wants_block`
        still says no (so a holder that asks for a block before each take asks nothing
        meanwhile), and no further than the current block's end. Empty when the pool is."""
        self._drop_used()
        blocks = self._blocks
        if not blocks or most < 1:
            return range(0)
        block = blocks[0]
        first = block.next
        last = min(first + most, block.end)
        if len(blocks) <= self.depth:
            # Fewer than depth ahead: wants_block() turns True at refill_at, so after the
            # first take no further than there.
            last = min(last, max(first + 1, block.refill_at))
        block.next = last
        return range(first, last)

    def _drop_used(self) -> None:
        blocks = self._blocks
        while blocks and blocks[0].next >= blocks[0].end:
            blocks.popleft()
