"""The lease keeper (lease_keeper.py) in this process, against a real etcd (Debian's
etcd-server, one per test process, a key prefix per test) and a real metadata log: a lease
counts only once its record is durable; a lost compare-and-swap takes the range after the
winner's; a data dir leases above what it granted alone; leases are taken ahead of demand;
while etcd is away the controller grants what it holds, then refuses, and takes a lease by
itself once etcd is back; a counter etcd cannot read is retried; the top of the id space
stops leasing. On the real clock: etcd's answers take real time."""

from __future__ import annotations

import base64
import itertools
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
import trio
import trio.testing

from ops.testing.coordination import EtcdProcess
from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.kafka import INT64_MAX
from pidctl.controller.core.producer_ids import LEASE_EXHAUSTED, Block, ProducerIdRange
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.server.fleet.etcd import EtcdCounter
from pidctl.controller.server.fleet.lease_keeper import (
    RETRY_MAX_S,
    RETRY_MIN_S,
    CounterWentBack,
    GrantBell,
    LeaseKeeper,
)
from pidctl.controller.server.transport.connection import now
from pidctl.protocol.addresses import EtcdLocation
from tests.controller.memory_log import MemoryLog
from tests.controller.server.conftest import ANSWER_BOUND_S, until

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for this module's tests (each under a prefix of its own); a test that stops
    it starts it again."""
    with EtcdProcess(tmp_path_factory.mktemp("etcd")) as proc:
        yield proc


@dataclass
class Kept:
    keeper: LeaseKeeper
    quorum: QuorumController
    log: MetadataLog
    nursery: trio.Nursery
    etcd: EtcdProcess
    prefix: str
    #: What ``on_lease`` was told: the size of each lease, once durable.
    leases: list[int] = field(default_factory=list)
    #: What ``on_counter_went_back`` was told, in order (None: leasing again).
    went_back: list[CounterWentBack | None] = field(default_factory=list)

    def grant(self) -> Block:
        """A block, as a job's AllocateProducerIds takes one (its grant rings the keeper's
        bell, an observer of the quorum controller, as in the server)."""
        manager = self.quorum.state.producer_ids
        block, _ = self.quorum.apply(
            manager.allocate_for_job(principal="User:test", client_id=None), now()
        )
        return block

    def held(self) -> list[tuple[int, int]]:
        return [(lease.first, lease.end) for lease in self.quorum.state.leases.leases]

    async def counter(self) -> int | None:
        return await trio.to_thread.run_sync(self.etcd.counter, self.prefix)

    async def set_counter(self, text: str | None) -> None:
        """Write the shared counter's key directly, or delete it (None), as an operator or
        another tool might."""
        key = base64.b64encode(f"{self.prefix}/next_producer_id".encode()).decode()
        body = {"key": key}
        if text is not None:
            body["value"] = base64.b64encode(text.encode()).decode()
        operation = "put" if text is not None else "deleterange"
        request = urllib.request.Request(
            f"http://{self.etcd.endpoint}/v3/kv/{operation}", data=json.dumps(body).encode()
        )

        def put() -> None:
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()

        await trio.to_thread.run_sync(put)


@asynccontextmanager
async def keeping(
    data_dir: Path,
    etcd: EtcdProcess,
    *,
    lease_size: int = 3000,
    prefetch_ratio: float = 0.5,
    start_log: bool = True,
    leased: bool = True,
) -> AsyncIterator[Kept]:
    """A keeper for a controller over a real log in ``data_dir`` (its writer started unless
    ``start_log`` is false), leasing under a new prefix of ``etcd``; ``leased``: the range
    is leased from the start (``pid_source`` set), else grants need no lease."""
    state = ControllerState().configure(pid_range=ProducerIdRange(leased=leased))
    quorum: QuorumController
    log = MetadataLog(data_dir, 0, 0, lambda: quorum.snapshot())
    bell = GrantBell()
    quorum = QuorumController(state, log, (bell.applied,))
    quorum.apply(state.cluster.create_cluster("test-cluster", 1), now())
    prefix = f"keeper{next(_prefixes)}"
    counter = EtcdCounter(EtcdLocation.parse(etcd.pid_source(prefix)), timeout_s=5.0, member="1")
    leases: list[int] = []
    went_back: list[CounterWentBack | None] = []
    keeper = LeaseKeeper(
        counter,
        quorum,
        log.wait_durable,
        now,
        bell,
        lease_size=lease_size,
        prefetch_ratio=prefetch_ratio,
        on_lease=leases.append,
        on_counter_went_back=went_back.append,
    )
    try:
        async with trio.open_nursery() as nursery:
            if start_log:
                await nursery.start(log.run)
            yield Kept(keeper, quorum, log, nursery, etcd, prefix, leases, went_back)
            nursery.cancel_scope.cancel()
    finally:
        await counter.aclose()


async def test_a_lease_counts_only_once_its_record_is_durable(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    async with keeping(tmp_path, shared_etcd, start_log=False) as kept:
        taken: list[tuple[int, int]] = []

        async def take() -> None:
            taken.append(await kept.keeper.take_lease())

        kept.nursery.start_soon(take)
        await until(lambda: kept.log.end_offset == 2)  # ClusterCreated, then the lease
        await trio.testing.wait_all_tasks_blocked()
        assert await kept.counter() == 3000  # taken from etcd...
        assert taken == [] and kept.leases == [] and not kept.keeper.leased.is_set()
        await kept.nursery.start(kept.log.run)
        with trio.fail_after(ANSWER_BOUND_S):
            await kept.keeper.leased.wait()  # ...counted once durable
        assert taken == [(0, 3000)] and kept.leases == [3000]
        assert kept.log.durable_end == 2


async def test_a_lost_compare_and_swap_takes_the_range_after_the_winner(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    async with keeping(tmp_path, shared_etcd) as kept:
        assert await kept.keeper.take_lease() == (0, 3000)
        # Another controller takes [3000, 5000) meanwhile: what this one saw is stale.
        other = EtcdCounter(EtcdLocation.parse(shared_etcd.pid_source(kept.prefix)))
        seen = await other.read()
        assert (await other.compare_and_swap(seen, 5000)).succeeded
        await other.aclose()
        assert await kept.keeper.take_lease() == (5000, 8000)
        assert await kept.counter() == 8000
        assert kept.held() == [(0, 3000), (5000, 8000)]


async def test_a_data_dir_that_granted_alone_leases_above_what_it_granted(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    async with keeping(tmp_path, shared_etcd, leased=False) as kept:
        assert [kept.grant().first for _ in range(3)] == [0, 1000, 2000]
        kept.quorum.state.configure(pid_range=ProducerIdRange(leased=True))  # pid_source
        assert await kept.counter() is None  # etcd has handed out nothing
        assert await kept.keeper.take_lease() == (3000, 6000)
        assert await kept.counter() == 6000


async def test_leases_are_taken_ahead_of_demand(tmp_path: Path, shared_etcd: EtcdProcess) -> None:
    """Lease 3000, prefetch ratio 0.5: the next lease is taken once a grant leaves less than
    1500 of the held lease, while grants go on from what is left."""
    async with keeping(tmp_path, shared_etcd) as kept:
        await kept.nursery.start(kept.keeper.run)
        with trio.fail_after(ANSWER_BOUND_S):
            await kept.keeper.leased.wait()
        assert kept.grant().first == 0  # 2000 left: enough
        await trio.testing.wait_all_tasks_blocked()
        assert kept.leases == [3000] and await kept.counter() == 3000
        assert kept.grant().first == 1000  # 1000 left: the next lease is due
        await until(lambda: len(kept.leases) == 2)
        assert await kept.counter() == 6000
        assert kept.held() == [(0, 3000), (3000, 6000)]
        assert [kept.grant().first for _ in range(4)] == [2000, 3000, 4000, 5000]


async def test_while_etcd_is_away_what_is_held_is_granted_then_refused_until_it_is_back(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    with structlog.testing.capture_logs() as logs:
        async with keeping(tmp_path, shared_etcd) as kept:
            await kept.nursery.start(kept.keeper.run)
            with trio.fail_after(ANSWER_BOUND_S):
                await kept.keeper.leased.wait()
            assert kept.grant().first == 0
            await trio.to_thread.run_sync(shared_etcd.kill)
            try:
                assert kept.grant().first == 1000  # 1000 left: a lease is wanted, etcd away
                await until(lambda: _events(logs, "etcd unavailable") != [])
                assert _events(logs, "etcd unavailable")[0]["lease_remaining"] == 1000
                assert kept.grant().first == 2000  # the last block held
                assert kept.grant().error == LEASE_EXHAUSTED  # retriable: REQUEST_TIMED_OUT
                await until(lambda: _events(logs, "producer ids exhausted") != [])
                await until(lambda: len(_failures(logs)) >= 4)  # (to see the back-off grow)
            finally:
                await trio.to_thread.run_sync(shared_etcd.start)
            await until(lambda: len(kept.leases) == 2)  # by itself, once etcd answers
            assert kept.grant().first == 3000
    assert len(_events(logs, "producer ids exhausted")) == 1  # said once, not per attempt
    assert len(_events(logs, "producer ids available again")) == 1
    # Each attempt waits twice as long as the one before, up to the most (the warnings say
    # how long; the one error does not).
    for attempt, failure in enumerate(_failures(logs)):
        if not _exhausted(failure):
            assert failure["retry_in_s"] == min(RETRY_MIN_S * 2**attempt, RETRY_MAX_S)


@pytest.mark.parametrize("back_to", ["1000", None], ids=["set-back", "deleted"])
async def test_no_lease_is_taken_from_a_counter_that_went_back_until_it_is_put_back(
    tmp_path: Path, shared_etcd: EtcdProcess, back_to: str | None
) -> None:
    """Below the highest lease seen, the counter would hand out ranges other controllers
    hold: refused, logged and reported (the server fails /readyz on it), until an operator
    puts it back; grants go on from what is held meanwhile."""
    with structlog.testing.capture_logs() as logs:
        async with keeping(tmp_path, shared_etcd) as kept:
            await kept.nursery.start(kept.keeper.run)
            with trio.fail_after(ANSWER_BOUND_S):
                await kept.keeper.leased.wait()
            await kept.set_counter(back_to)
            assert [kept.grant().first for _ in range(2)] == [0, 1000]  # a lease is wanted
            await until(lambda: kept.went_back != [])
            refusal = kept.went_back[0]
            assert refusal is not None and (refusal.counter, refusal.highest) == (
                int(back_to or 0),
                3000,
            )
            assert kept.held() == [(0, 3000)] and kept.grant().first == 2000
            [logged] = _events(logs, "etcd counter went back")
            assert (logged["counter"], logged["highest_lease_seen"]) == (int(back_to or 0), 3000)
            await kept.set_counter("3000")
            await until(lambda: len(kept.leases) == 2)
            assert kept.held() == [(3000, 6000)] and kept.went_back[-1] is None
            assert _events(logs, "etcd counter at or above the highest lease seen again")


async def test_a_counter_set_back_below_another_controllers_lease_is_refused(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    """Set back to a value above all this controller saw itself but below a lease another
    controller took since: the lease recorded beside the counter says it went back (the
    fault campaign found two such ranges granted by both before it was recorded)."""
    async with keeping(tmp_path, shared_etcd) as kept:
        await kept.nursery.start(kept.keeper.run)
        with trio.fail_after(ANSWER_BOUND_S):
            await kept.keeper.leased.wait()
        location = EtcdLocation.parse(shared_etcd.pid_source(kept.prefix))
        other = EtcdCounter(location, member="2")
        assert (await other.compare_and_swap(await other.read(), 9000)).succeeded  # [3000, 9000)
        await other.aclose()
        await kept.set_counter("6000")  # above this one's 3000, inside the other's lease
        assert [kept.grant().first for _ in range(2)] == [0, 1000]  # a lease is wanted
        await until(lambda: kept.went_back != [])
        refusal = kept.went_back[0]
        assert refusal is not None and (refusal.counter, refusal.highest) == (6000, 9000)
        assert kept.held() == [(0, 3000)] and kept.leases == [3000]
        await kept.set_counter("9000")
        await until(lambda: len(kept.leases) == 2)
        assert kept.held() == [(0, 3000), (9000, 12_000)] and kept.went_back[-1] is None


async def test_a_counter_etcd_refuses_to_read_is_retried_until_it_is_mended(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    with structlog.testing.capture_logs() as logs:
        async with keeping(tmp_path, shared_etcd) as kept:
            await kept.set_counter("garbage")
            await kept.nursery.start(kept.keeper.run)
            await until(lambda: _events(logs, "producer ids exhausted") != [])
            assert "not a producer id" in _events(logs, "producer ids exhausted")[0]["error"]
            assert kept.held() == []
            await kept.set_counter("5000")
            with trio.fail_after(ANSWER_BOUND_S):
                await kept.keeper.leased.wait()
            assert kept.held() == [(5000, 8000)]


async def test_no_lease_is_taken_past_the_last_producer_id(
    tmp_path: Path, shared_etcd: EtcdProcess
) -> None:
    with structlog.testing.capture_logs() as logs:
        async with keeping(tmp_path, shared_etcd) as kept:
            await kept.set_counter(str(INT64_MAX - 1000))
            await kept.nursery.start(kept.keeper.run)
            await until(lambda: _events(logs, "producer id space exhausted") != [])
            await trio.testing.wait_all_tasks_blocked()
            assert kept.held() == [] and await kept.counter() == INT64_MAX - 1000
            assert kept.grant().error == LEASE_EXHAUSTED
    assert len(_events(logs, "producer id space exhausted")) == 1  # and it stopped trying


def _exhausted(event: MutableMapping[str, Any]) -> bool:
    return str(event["event"]).startswith("producer ids exhausted")


def _failures(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    """The keeper's attempts that failed, in order."""
    return [e for e in logs if e["event"] == "etcd unavailable" or _exhausted(e)]


def _events(logs: list[MutableMapping[str, Any]], start: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if str(e["event"]).startswith(start)]


async def test_the_bell_rings_for_a_grant_the_quorum_controller_applies() -> None:
    """The keeper's bell is an observer of the quorum controller: a grant rings it, another
    record does not; rearmed, it waits for the next grant."""
    bell = GrantBell()
    state = ControllerState()
    quorum = QuorumController(state, MemoryLog(), (bell.applied,))
    quorum.apply(state.cluster.create_cluster("test-cluster", 1), now())
    with trio.move_on_after(0.05) as waited:
        await bell.wait()
    assert waited.cancelled_caught  # no grant yet
    quorum.apply(state.producer_ids.allocate_for_job(principal="User:a", client_id=None), now())
    with trio.fail_after(ANSWER_BOUND_S):
        await bell.wait()
    bell.rearm()
    with trio.move_on_after(0.05) as waited:
        await bell.wait()
    assert waited.cancelled_caught
