"""The periodic expiry: every interval, what is due expires in steps of ``batch`` ids,
each step durable before the next; counted and said once per round."""

from __future__ import annotations

import structlog.testing
import trio
import trio.testing

from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.records import ProducerIdsGranted, TransactionalIdUpdated
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState
from pidctl.controller.server.expiry import Expiry
from pidctl.controller.server.telemetry.metrics import Metrics
from tests.controller.memory_log import MemoryLog


class _MemoryLog(MemoryLog):
    """Also records the offsets waited on."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[int] = []

    async def wait_durable(self, offset: int) -> None:
        self.waited.append(offset)


async def test_what_is_due_expires_in_steps_each_durable_before_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    state = ControllerState().configure(transactional_id_expiration_ms=10_000)
    log = _MemoryLog()
    quorum = QuorumController(state, log)
    long_ago = Now(1_000, 1_000)  # (the records' wall clock; expiry asks the real one)
    quorum.apply(state.cluster.create_cluster("c", 1), long_ago)
    grant = ProducerIdsGranted(1, -1, 0, 1000, holder="test")
    quorum.apply(ControllerResult((grant,), None), long_ago)
    updates = tuple(TransactionalIdUpdated(f"t{n}", n, 0, -1, -1, 60_000, 1_000) for n in range(5))
    quorum.apply(ControllerResult(updates, None), long_ago)
    metrics = Metrics()
    expiry = Expiry(quorum, log.wait_durable, metrics, interval_s=60.0, batch=2)
    with structlog.testing.capture_logs() as said:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(expiry.run)
            await trio.sleep(61.0)  # one round (the mock clock jumps)
            nursery.cancel_scope.cancel()
    assert len(state.transactions.transactional_ids) == 0
    assert len(log.waited) == 2  # steps of 2, 2, then 1 (the last waits for nothing)
    assert metrics.registry.get_sample_value("pidctl_transactional_ids_expired_total") == 5
    [line] = [e for e in said if e["event"] == "transactional ids expired"]
    assert (line["count"], line["steps"]) == (5, 3)
