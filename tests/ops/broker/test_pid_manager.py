"""The prefetching producer-id manager.

The rule tests feed it a scripted ``fetch``: the real controller never hands out an
overlapping, negative or overflowing block, so that is the only way to see them refused.
The end-to-end test uses the real server, killed and restarted while brokers keep asking."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ops.testing.serverproc import ServerProcess
from pidctl.broker.lifecycle import BrokerLifecycle, SyncBroker
from pidctl.broker.pid_manager import (
    AllocationRefused,
    CoordinatorLoadInProgress,
    ProducerIdManager,
)
from pidctl.controller.core.blocks import InvalidBlock
from pidctl.controller.core.kafka import INT64_MAX
from tests import latency


def scripted(blocks: list[tuple[int, int] | Exception]) -> tuple[list[float], object]:
    calls: list[float] = []
    queue: Iterator[tuple[int, int] | Exception] = iter(blocks)

    async def fetch() -> tuple[int, int]:
        calls.append(trio.current_time())
        item = next(queue, AllocationRefused("script exhausted"))
        if isinstance(item, Exception):
            raise item
        return item

    return calls, fetch


def test_invalid_blocks_are_refused() -> None:
    manager = ProducerIdManager(scripted([])[1])  # type: ignore[arg-type]
    manager.accept_block(1000, 1000)
    for first, length in [(500, 1000), (1500, 1000), (-1, 10), (3000, 0), (INT64_MAX - 5, 10)]:
        with pytest.raises(InvalidBlock):
            manager.accept_block(first, length)
    manager.accept_block(2000, 1000)
    assert manager.remaining == 2000


async def test_never_blocks_prefetches_at_90_percent_and_backs_off() -> None:
    calls, fetch = scripted([AllocationRefused("down"), (0, 100), (100, 100), (200, 100)])
    manager = ProducerIdManager(fetch, adaptive=False)  # type: ignore[arg-type]
    with pytest.raises(CoordinatorLoadInProgress):
        manager.generate()  # nothing yet: answered at once, not waited for
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        while manager.remaining == 0:
            await trio.sleep(0.01)
        assert calls[1] - calls[0] >= 0.05  # 50 ms back-off after the failure
        assert [manager.generate() for _ in range(89)] == list(range(89))
        await trio.sleep(0.05)
        assert len(calls) == 2  # below 90% of the block: no prefetch yet
        manager.generate()  # the 90th
        await trio.sleep(0.05)
        assert len(calls) == 3 and manager.remaining == 110  # the next block, prefetched
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("adaptive", [True, False])
async def test_adaptive_mode_keeps_ahead_of_a_burst(adaptive: bool, autojump_clock: Any) -> None:
    """On trio's virtual clock (``autojump_clock``): the round trips and the bursts' pace
    are the script's, whatever else the machine is doing."""
    counter = iter(range(0, 10**9, 1000))

    async def fetch() -> tuple[int, int]:
        await trio.sleep(0.01)  # a controller round trip
        return next(counter), 1000

    manager = ProducerIdManager(fetch, adaptive=adaptive)
    refused = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await trio.sleep(0.05)
        for _ in range(200):  # 200 x 100 PIDs every 5 ms: 20,000 PIDs/s
            for _ in range(100):
                try:
                    manager.generate()
                except CoordinatorLoadInProgress:
                    refused += 1
            await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    if adaptive:
        assert refused == 0, f"{refused} callers saw COORDINATOR_LOAD_IN_PROGRESS"
    else:
        assert refused > 0  # Kafka's fixed 90% threshold cannot keep up with this burst


@pytest.mark.slow
async def test_brokers_keep_asking_while_the_server_is_killed(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d")
    await trio.to_thread.run_sync(server.start)
    pids: list[int] = []
    refused = 0
    took: list[float] = []
    lifecycles = [
        BrokerLifecycle(server.bootstrap, b, heartbeat_interval_s=0.2) for b in range(1, 5)
    ]
    managers = [ProducerIdManager(lc.allocate) for lc in lifecycles]
    # The baseline: a manager whose blocks come from memory, timed the same way beside each
    # call, so that a busy machine slows both alike.
    local_blocks = iter(range(0, 10**12, 1000))

    async def from_memory() -> tuple[int, int]:
        return next(local_blocks), 1000

    baseline = ProducerIdManager(from_memory)
    baseline_took: list[float] = []

    async def producers(manager: ProducerIdManager, stop: trio.Event) -> None:
        nonlocal refused
        while not stop.is_set():
            started = time.perf_counter()
            try:
                pids.append(manager.generate())
            except CoordinatorLoadInProgress:
                refused += 1
            took.append(time.perf_counter() - started)
            started = time.perf_counter()
            with contextlib.suppress(CoordinatorLoadInProgress):
                baseline.generate()
            baseline_took.append(time.perf_counter() - started)
            await trio.sleep(0.0005)

    try:
        async with trio.open_nursery() as nursery:
            stop = trio.Event()
            await nursery.start(baseline.run)
            for lifecycle, manager in zip(lifecycles, managers, strict=True):
                await nursery.start(lifecycle.run)
                nursery.start_soon(manager.run)
                nursery.start_soon(producers, manager, stop)
            for _ in range(3):
                await trio.sleep(1.0)
                await trio.to_thread.run_sync(server.kill)
                await trio.sleep(0.3)
                await trio.to_thread.run_sync(server.start)
                for lifecycle in lifecycles:  # the restarted server binds a new port
                    lifecycle.bootstrap = server.bootstrap
            await trio.sleep(1.0)
            stop.set()
            for lifecycle in lifecycles:
                await lifecycle.shutdown()
            nursery.cancel_scope.cancel()
    finally:
        server.kill()
    assert len(pids) > 1000
    assert len(set(pids)) == len(pids), "a producer id was handed out twice"
    # generate() never waits, also while the server is down (it answers "load in progress"
    # instead): its slowest 1% are as quick as the in-memory baseline's, where a wait for
    # the network would take milliseconds in every call of an outage.
    mine, theirs = latency.Latencies(sorted(took)), latency.Latencies(sorted(baseline_took))
    assert mine.p99 < 10 * theirs.p99 + 0.001, (mine.p99, theirs.p99)
    assert all(lc.registrations >= 1 for lc in lifecycles)


def test_sync_wrapper(server: ServerProcess) -> None:
    broker = SyncBroker(server.bootstrap, 42)
    try:
        deadline = time.monotonic() + 10
        pids: list[int] = []
        while len(pids) < 2500:
            try:
                pids.append(broker.generate_producer_id())
            except CoordinatorLoadInProgress:
                assert time.monotonic() < deadline
                time.sleep(0.01)
    finally:
        broker.close()
    assert len(set(pids)) == 2500
