"""A fleet of `pidctl serve` sharing one PID space through etcd leases (real etcd, real
controllers, real brokers over TCP; processes SIGKILLed and restarted)."""

from __future__ import annotations

import random
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from ops.bench.common import first_overlap
from ops.testing.coordination import EtcdProcess, free_port
from ops.testing.serverproc import ServerProcess, wait_until_async
from pidctl.broker.lifecycle import BrokerLifecycle
from pidctl.broker.pid_manager import AllocationRefused
from pidctl.client import SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.records import JobBlockRecorded, ProducerIdsLeased
from pidctl.controller.log.datadir import read_reservation
from pidctl.controller.log.recovery import read_log
from pidctl.protocol import requests
from pidctl.spark import kafka_driver
from pidctl.spark.allocation import JobAllocation, PreallocationError
from tests.e2e.test_operations import http_status


def allocate_named(
    bootstrap: str, count: int, app: str, version: int, **client: Any
) -> JobAllocation:
    """The driver's named allocation (``kafka_driver.allocate_named``) with the credentials
    as the sink passes them; a refusal is not asked again."""
    named = kafka_driver.allocate_named(
        bootstrap, count, app, version, connection=client, budget_s=5
    )
    return named.allocation


CLUSTER_ID = "fleetFleetFleetFleet01"


def _controller(tmp_path: Path, etcd: EtcdProcess, node: int, *extra: str) -> ServerProcess:
    return ServerProcess(
        tmp_path / f"c{node}",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--node-id",
        str(node),
        "--cluster-id",
        CLUSTER_ID,
        "--pid-source",
        etcd.pid_source(),
        *extra,
    )


def _metric(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


def _no_overlap(blocks: list[tuple[int, int]]) -> None:
    assert first_overlap(blocks) is None, f"blocks at {first_overlap(blocks)} overlap"


@pytest.mark.slow
async def test_union_of_acknowledged_blocks_never_overlaps_under_kills(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    controllers = [
        _controller(tmp_path, etcd, node, "--pid-lease-size", "20000") for node in (1, 2, 3)
    ]
    for c in controllers:
        await trio.to_thread.run_sync(c.start)
    blocks: list[tuple[int, int]] = []
    refusals: dict[str, int] = {}
    connection_errors = 0
    per_controller = [0, 0, 0]
    lifecycles = [
        BrokerLifecycle(controllers[b % 3].bootstrap, 100 + b, heartbeat_interval_s=0.2)
        for b in range(6)
    ]
    rng = random.Random(7)

    async def allocate_forever(index: int, lifecycle: BrokerLifecycle) -> None:
        nonlocal connection_errors
        while True:
            try:
                first, length = await lifecycle.allocate()
                blocks.append((first, length))
                per_controller[index % 3] += 1
            except AllocationRefused as e:
                refusals[str(e)] = refusals.get(str(e), 0) + 1
                await trio.sleep(0.02)
            except (ConnectionError, OSError):
                connection_errors += 1  # the controller was killed under it
                await trio.sleep(0.02)
            await trio.sleep(0.002)

    kills = {"controller": 0, "etcd": 0}
    try:
        async with trio.open_nursery() as nursery:
            for index, lifecycle in enumerate(lifecycles):
                nursery.start_soon(lifecycle.run)
                nursery.start_soon(allocate_forever, index, lifecycle)

            # Until every goal is met (not for a fixed time: a busy machine serves fewer
            # blocks per second), bounded.
            def enough() -> bool:
                return (
                    kills["controller"] >= 5
                    and kills["etcd"] >= 2
                    and len(blocks) > 300
                    and all(n > 20 for n in per_controller)
                )

            deadline = time.monotonic() + 180
            while not enough() and time.monotonic() < deadline:
                await trio.sleep(rng.uniform(0.3, 0.9))
                if rng.random() < 0.3:
                    kills["etcd"] += 1
                    await trio.to_thread.run_sync(etcd.kill)
                    await trio.sleep(rng.uniform(0.2, 1.5))
                    await trio.to_thread.run_sync(etcd.start)
                else:
                    kills["controller"] += 1
                    victim = rng.choice(controllers)
                    await trio.to_thread.run_sync(victim.kill)
                    await trio.sleep(rng.uniform(0.05, 0.5))
                    await trio.to_thread.run_sync(victim.start)
            nursery.cancel_scope.cancel()
    finally:
        for c in controllers:
            c.kill()
    assert kills["controller"] >= 5 and kills["etcd"] >= 2, kills
    assert len(blocks) > 300, (len(blocks), refusals)
    assert all(n > 20 for n in per_controller), per_controller
    _no_overlap(blocks)
    # Only the documented retriable refusal (out of lease while etcd was away).
    assert set(refusals) <= {"AllocateProducerIds: request_timed_out"}, refusals
    assert connection_errors > 0
    # Every lease in every log is disjoint from the others, and each grant lies in its own.
    leases = [
        (e.record.first_producer_id, e.record.next_producer_id - e.record.first_producer_id)
        for c in controllers
        for e in read_log(c.data_dir).entries()
        if isinstance(e.record, ProducerIdsLeased)
    ]
    _no_overlap(leases)
    # etcd's counter is never behind a log (or it would hand out a range again). It may be
    # ahead by whole leases taken from etcd and not yet durable in a log when a kill came
    # (mostly the final kills): at most one per kill.
    counter = etcd.counter()
    assert counter is not None
    ahead = counter - max(first + size for first, size in leases)
    killed = kills["controller"] + len(controllers)
    assert ahead % 20_000 == 0 and 0 <= ahead <= 20_000 * killed, (ahead, killed)


def _allocate_job(client: SyncClient) -> tuple[int, int, int]:
    response = client.request(requests.allocate(-1, -1))
    return int(response.error_code), int(response.producer_id_start), int(response.producer_id_len)


def _init(client: SyncClient) -> int:
    return int(client.request(requests.init_producer_id()).error_code)


async def test_etcd_outage_serves_what_is_held_then_refuses_then_recovers(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    server = _controller(tmp_path, etcd, 1, "--pid-lease-size", "10000")
    await trio.to_thread.run_sync(server.start)
    try:
        with SyncClient(server.bootstrap) as client:
            assert _allocate_job(client)[0] == 0
            held = int(_metric(server, "pidctl_pid_lease_remaining"))
            assert held == 9000 and _metric(server, "pidctl_pid_lease_size") == 10_000
            await trio.to_thread.run_sync(etcd.kill)
            served = [_allocate_job(client) for _ in range(held // 1000)]
            assert all(error == 0 for error, _, _ in served)
            _no_overlap([(first, length) for _, first, length in served])
            # Out of lease, etcd still away: retriable refusals, as documented.
            assert _allocate_job(client) == (7, 0, 0)  # REQUEST_TIMED_OUT
            await wait_until_async(
                lambda: _metric(server, "pidctl_etcd_request_failures_total") > 0,
                "etcd failures counted",
            )
            await wait_until_async(
                lambda: any(e["event"].startswith("producer ids exhausted") for e in server.events),
                "the exhaustion logged",
            )
            await trio.to_thread.run_sync(etcd.start)
            answers: list[tuple[int, int, int]] = []

            def granted() -> bool:
                answers.append(_allocate_job(client))
                return answers[-1][0] == 0

            await wait_until_async(granted, "a block after etcd came back")  # by itself
            assert answers[-1][1] >= max(f + n for _, f, n in served)
            await wait_until_async(
                lambda: any(e["event"] == "producer ids available again" for e in server.events),
                "the recovery logged",
            )
    finally:
        server.kill()


async def test_a_controller_without_etcd_refuses_init_producer_id_until_it_has_a_lease(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    await trio.to_thread.run_sync(etcd.kill)
    server = _controller(tmp_path, etcd, 1)
    await trio.to_thread.run_sync(server.start)  # starts and listens without etcd
    try:
        with SyncClient(server.bootstrap) as client:
            assert _init(client) == 14  # COORDINATOR_LOAD_IN_PROGRESS
            assert _allocate_job(client)[0] == 7
            await trio.to_thread.run_sync(etcd.start)
            await wait_until_async(lambda: _init(client) == 0, "a PID once etcd is up")
    finally:
        server.kill()


async def test_restart_continues_inside_its_lease_even_without_etcd(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    server = _controller(
        tmp_path, etcd, 1, "--pid-lease-size", "50000", "--producer-id-reservation", "10000"
    )
    await trio.to_thread.run_sync(server.start)
    with SyncClient(server.bootstrap) as client:
        before = [_allocate_job(client) for _ in range(3)]
    counter = etcd.counter()
    server.kill()
    reserved = read_reservation(server.data_dir)
    assert reserved == 11_000  # reserved at the first grant, [0, 1000): 10,000 ahead
    await trio.to_thread.run_sync(etcd.kill)
    await trio.to_thread.run_sync(server.start)
    try:
        with SyncClient(server.bootstrap) as client:
            after = [_allocate_job(client) for _ in range(3)]
        # Where the reservation says (the log's tail may have lost grants below it), still
        # inside the lease.
        assert [f for _, f, _ in after] == [11_000, 12_000, 13_000]
        assert [f for _, f, _ in before] == [0, 1000, 2000]
    finally:
        server.kill()
    await trio.to_thread.run_sync(etcd.start)
    assert etcd.counter() == counter  # no new lease was needed


def test_a_data_dir_that_leased_will_not_start_without_pid_source(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with _controller(tmp_path, etcd, 1) as server, SyncClient(server.bootstrap) as client:
        assert _allocate_job(client)[0] == 0
    plain = ServerProcess(tmp_path / "c1")
    with pytest.raises(RuntimeError, match="took its producer ids from etcd leases"):
        plain.start()


def test_tls_to_etcd_is_a_setting(tmp_path: Path, tls_etcd: tuple[EtcdProcess, Path]) -> None:
    etcd, ca_file = tls_etcd
    source = etcd.pid_source()
    assert source.startswith("etcds://")
    trusting = ServerProcess(tmp_path / "a", "--pid-source", source, "--etcd-cafile", str(ca_file))
    with trusting, SyncClient(trusting.bootstrap) as client:
        assert _allocate_job(client)[0] == 0
    # Without the CA the certificate is refused: no lease, a retriable answer, a reason.
    with ServerProcess(tmp_path / "b", "--pid-source", source) as untrusting:
        with SyncClient(untrusting.bootstrap) as client:
            assert _allocate_job(client)[0] == 7
        assert any("CERTIFICATE_VERIFY_FAILED" in str(e.get("error")) for e in untrusting.events)


def _regression_counted(server: ServerProcess) -> Callable[[], bool]:
    return lambda: _metric(server, "pidctl_etcd_counter_regressions_total") > 0


def _ready(server: ServerProcess) -> Callable[[], bool]:
    return lambda: http_status(server.metrics_url + "/readyz") == 200


@pytest.mark.parametrize("fault", ["deleted", "set back"])
async def test_a_counter_that_goes_back_never_makes_two_controllers_share_a_range(
    tmp_path: Path, etcd: EtcdProcess, fault: str
) -> None:
    """Two controllers on one etcd; the counter key is deleted, or set back below the
    leases taken, while they serve. Neither leases from it (their leases would be ranges
    the other holds): each refuses, says so in its log, counts it and fails /readyz, and
    serves what it holds; once an operator puts the counter back, both lease again."""
    first = _controller(tmp_path, etcd, 1, "--pid-lease-size", "10000")
    second = _controller(tmp_path, etcd, 2, "--pid-lease-size", "10000")
    for server in (first, second):
        await trio.to_thread.run_sync(server.start)  # each takes a lease before listening
    try:
        with SyncClient(first.bootstrap) as one, SyncClient(second.bootstrap) as two:
            granted = [_allocate_job(client) for client in (one, two) for _ in range(2)]
            assert etcd.counter() == 20_000
            if fault == "deleted":
                await trio.to_thread.run_sync(etcd.delete_counter)
            else:
                await trio.to_thread.run_sync(etcd.set_counter, 5000)
            # Past the prefetch point and past the end of both leases.
            for _ in range(12):
                granted += [_allocate_job(one), _allocate_job(two)]
            blocks = [(start, length) for error, start, length in granted if error == 0]
            _no_overlap(blocks)
            assert {error for error, _, _ in granted} <= {0, 7}  # 7: REQUEST_TIMED_OUT
            assert len(blocks) == 20  # each controller served its whole lease, no more
            for server in (first, second):
                await wait_until_async(_regression_counted(server), "the regression counted")
                assert http_status(server.metrics_url + "/readyz") == 503
                refused = next(e for e in server.events if e["event"] == "etcd counter went back")
                assert refused["level"] == "error" and refused["highest_lease_seen"] >= 10_000
            # The operator puts the counter back where it was: both lease again, ready.
            await trio.to_thread.run_sync(etcd.set_counter, 20_000)
            for server, client in ((first, one), (second, two)):
                await wait_until_async(_ready(server), "ready again")
                after = _allocate_job(client)
                assert after[0] == 0 and after[1] >= 20_000
                blocks.append((after[1], after[2]))
            _no_overlap(blocks)
    finally:
        first.kill()
        second.kill()


def test_a_named_jobs_rerun_on_another_controller_never_gets_other_blocks(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    """Job records stay in each controller's own log: a version recorded on one controller
    and re-run on another would get other blocks there (rows written twice). So a fleet
    answers no named job, on any controller, and records none; the Spark driver says why.
    A job without a name is served as before."""
    controllers = [_controller(tmp_path, etcd, node) for node in (1, 2)]
    try:
        for server in controllers:
            server.start()
        key = JobKey("nightly", 1, 0).client_id()
        for server in controllers:  # the first run on one, the re-run on the other
            with SyncClient(server.bootstrap) as client:
                (named,) = client.pipeline([requests.allocate(-1, -1)], [key])
                assert named.error_code == ErrorCode.invalid_request
                assert _allocate_job(client)[0] == 0
            with pytest.raises(PreallocationError, match="fleet with pid_source"):
                allocate_named(server.bootstrap, 10, "nightly", 1)
    finally:
        for server in controllers:
            server.kill()
    for server in controllers:
        records = [entry.record for entry in read_log(server.data_dir).entries()]
        assert not any(isinstance(record, JobBlockRecorded) for record in records)
