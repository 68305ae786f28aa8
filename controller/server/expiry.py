"""The periodic expiries: transactional ids and job app ids unused past their settings,
logged in steps so that requests decided meanwhile share the log with them."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

import structlog
import trio

from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.connection import now

log: Final = structlog.get_logger("pidctl.server")


class Expiry:
    """Every ``interval_s``, expires what is due, ``batch`` ids a step."""

    def __init__(
        self,
        quorum: QuorumController,
        wait_durable: Callable[[int], Awaitable[None]],
        metrics: Metrics,
        *,
        interval_s: float,
        batch: int,
    ) -> None:
        self.quorum = quorum
        self._wait_durable = wait_durable
        self.metrics = metrics
        self.interval_s = interval_s
        self.batch = batch

    async def run(self) -> None:
        """Every cleanup interval, expire what is due in steps of at most
        ``transactional_id_expiry_batch`` ids (Kafka's TransactionStateManager removes
        expired ids in batches too): each step costs what it expires, and the next one waits
        until it is durable, so the requests decided meanwhile share the log with it instead
        of queueing behind every expiry at once."""
        quorum, batch = self.quorum, self.batch
        while True:
            await trio.sleep(self.interval_s)
            total = steps = 0
            longest = 0.0  # the event loop's CPU time in one step: what a request waits behind
            while True:
                started = time.thread_time()
                expired, offset = quorum.expire_transactional_ids(now(), batch)
                longest = max(longest, time.thread_time() - started)
                total += expired
                steps += 1
                self.metrics.transactional_ids_expired.inc(expired)
                if expired < batch:
                    break
                await self._wait_durable(offset)
                await trio.lowlevel.checkpoint()  # (durable already: other work first all the same)
            if total:
                log.info(
                    "transactional ids expired",
                    count=total,
                    steps=steps,
                    longest_step_cpu_ms=round(longest * 1000, 3),
                )
            # Job app ids past job_allocation_expiration_ms, the same way.
            total = 0
            while True:
                expired, offset = quorum.expire_job_allocations(now(), batch)
                total += expired
                if expired < batch:
                    break
                await self._wait_durable(offset)
            if total:
                log.info("job allocations expired", count=total)
