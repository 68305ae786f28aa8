"""The controller's own producer-id pool for InitProducerId: KIP-730's broker-side rules.

It holds the current block plus the next one, asked for once 90% of the current block is
used, so InitProducerId almost never waits for a block. Blocks come from the same grant path
(and the same durable records) as a broker's AllocateProducerIds. A PID may be answered only
once the grant record of its block is durable; each PID carries that record's offset.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: Kafka's ProducerIdManager prefetches the next block once this share of the current is used.
PREFETCH_THRESHOLD = 0.9


@dataclass(slots=True)
class _Block:
    next: int
    end: int  # exclusive
    grant_offset: int
    size: int


class ProducerIdPool:
    """Current and prefetched blocks; pure (the caller asks for and records the grants)."""

    def __init__(self, threshold: float = PREFETCH_THRESHOLD) -> None:
        self.threshold = threshold
        self._blocks: deque[_Block] = deque()

    @property
    def remaining(self) -> int:
        return sum(b.end - b.next for b in self._blocks)

    def wants_block(self) -> bool:
        """True when there is no block, or only one and it is at least 90% used."""
        self._drop_exhausted()
        if not self._blocks:
            return True
        if len(self._blocks) > 1:
            return False
        current = self._blocks[0]
        used = current.size - (current.end - current.next)
        return used >= self.threshold * current.size

    def add_block(self, first: int, end: int, grant_offset: int) -> None:
        if self._blocks and first < self._blocks[-1].end:
            raise ValueError(f"block at {first} overlaps the pool")
        self._blocks.append(_Block(first, end, grant_offset, end - first))

    def take(self) -> tuple[int, int] | None:
        """The next PID and the offset of its block's grant record, or None if empty."""
        self._drop_exhausted()
        if not self._blocks:
            return None
        block = self._blocks[0]
        pid = block.next
        block.next += 1
        return pid, block.grant_offset

    def _drop_exhausted(self) -> None:
        while self._blocks and self._blocks[0].next >= self._blocks[0].end:
            self._blocks.popleft()
