"""The broker side of KIP-730: a producer-id manager that never blocks its callers.

It holds the current block and prefetches the next once 90% of the current one is used
(Kafka's RPCProducerIdManager), with one request in flight at a time and a 50 ms back-off
after any failure. A block that overlaps what it already has, is negative or overflows is
refused. When no PID is ready, :meth:`generate` raises :class:`CoordinatorLoadInProgress`
(Kafka answers COORDINATOR_LOAD_IN_PROGRESS, which every client retries) instead of waiting.

Beyond Kafka: ``prefetch_depth`` blocks may be held ahead, the threshold is a setting, and
with ``adaptive`` the manager asks again sooner when PIDs are consumed fast: it keeps enough
ahead to cover the observed rate for a few fetch round trips, so a burst of producers does
not run the pool dry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
import trio

from pidctl.controller.core.blocks import InvalidBlock, ProducerIdPool
from pidctl.controller.core.kafka import PREFETCH_THRESHOLD

log = structlog.get_logger("pidctl.broker.pid_manager")

#: Kafka's RetryBackoffMs for failed allocations.
RETRY_BACKOFF_S = 0.05
#: Adaptive mode keeps the PIDs for this many fetch round trips at the observed rate.
_ROUND_TRIPS_AHEAD = 4
_MAX_BLOCKS_AHEAD = 64
#: The consumption rate is re-measured over windows this long: short enough to see a burst
#: coming before the first block runs out.
_RATE_WINDOW_S = 0.02

Fetch = Callable[[], Awaitable[tuple[int, int]]]  # returns (first producer id, length)


class CoordinatorLoadInProgress(Exception):
    """No producer id is ready yet; answer COORDINATOR_LOAD_IN_PROGRESS and retry."""


class ProducerIdManager:
    def __init__(
        self,
        fetch: Fetch,
        *,
        prefetch_threshold: float = PREFETCH_THRESHOLD,
        prefetch_depth: int = 1,
        adaptive: bool = True,
        backoff_s: float = RETRY_BACKOFF_S,
    ) -> None:
        self._pool = ProducerIdPool(prefetch_threshold, prefetch_depth)
        self._fetch = fetch
        self.adaptive = adaptive
        self.backoff_s = backoff_s
        self._wanted = trio.Event()
        self._rate = 0.0  # PIDs per second, smoothed
        self._rate_since = 0.0
        self._rate_count = 0
        self._fetch_seconds = 0.05

    @property
    def remaining(self) -> int:
        return self._pool.remaining

    def generate(self) -> int:
        """The next producer id, at once; CoordinatorLoadInProgress if none is ready."""
        pid = self._pool.take()
        if pid is None:
            self._wanted.set()
            raise CoordinatorLoadInProgress("no producer id block ready")
        self._observe_use()
        if self._wants_more():
            self._wanted.set()
        return pid

    def _observe_use(self) -> None:
        now = trio.current_time()
        self._rate_count += 1
        elapsed = now - self._rate_since
        if elapsed >= _RATE_WINDOW_S:
            current = self._rate_count / elapsed
            self._rate = current if self._rate == 0 else 0.7 * self._rate + 0.3 * current
            self._rate_since, self._rate_count = now, 0

    def _wants_more(self) -> bool:
        if self._pool.wants_block():
            return True
        if self.adaptive and self._pool.blocks_ahead < _MAX_BLOCKS_AHEAD:
            needed = self._rate * self._fetch_seconds * _ROUND_TRIPS_AHEAD
            return self.remaining < needed
        return False

    def accept_block(self, first: int, length: int) -> None:
        """Add a granted block after Kafka's checks (the one block pool's); raises
        :class:`InvalidBlock` for one that overlaps, is negative or overflows."""
        self._pool.add_block(first, length)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch blocks when wanted: one request at a time, 50 ms back-off after a failure."""
        self._wanted.set()  # the first block, right away
        task_status.started()
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            if not self._wants_more():
                continue
            started = trio.current_time()
            try:
                first, length = await self._fetch()
                self.accept_block(first, length)
                took = trio.current_time() - started
                self._fetch_seconds = 0.8 * self._fetch_seconds + 0.2 * took
            except (OSError, ConnectionError, InvalidBlock, AllocationRefused) as e:
                log.warning("producer id block not obtained", error=str(e))
                await trio.sleep(self.backoff_s)
            if self._wants_more():
                self._wanted.set()


class AllocationRefused(Exception):
    """The controller answered AllocateProducerIds with an error code."""
