"""InitProducerId, Metadata and FindCoordinator over the wire, rule by rule and version by
version, against the real server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.controller.log.logtools import dump_lines
from pidctl.protocol import requests
from tests import wire

TIMEOUTS_CLIENTS_SEND = [-1, 0, 60_000, 2**31 - 1]


@pytest.mark.parametrize("version", range(6))
def test_idempotent_gets_fresh_pids_at_epoch_zero(server: ServerProcess, version: int) -> None:
    with SyncClient(server.bootstrap) as client:
        responses = client.pipeline(
            [requests.init_producer_id(None, t, version=version) for t in TIMEOUTS_CLIENTS_SEND]
        )
    assert [r.error_code for r in responses] == [ErrorCode.none] * 4
    assert [r.producer_epoch for r in responses] == [0] * 4
    pids = [r.producer_id for r in responses]
    assert len(set(pids)) == 4 and min(pids) >= 0


@pytest.mark.parametrize("version", range(6))
def test_transactional_validation(tmp_path: Path, version: int) -> None:
    server = ServerProcess(tmp_path / "d", "--transaction-max-timeout-ms", "1000")
    with server, SyncClient(server.bootstrap) as client:
        empty, zero, negative, too_long, at_max = client.pipeline(
            [
                requests.init_producer_id("", version=version),
                requests.init_producer_id("tx", 0, version=version),
                requests.init_producer_id("tx", -1, version=version),
                requests.init_producer_id("tx", 1001, version=version),
                requests.init_producer_id("tx", 1000, version=version),
            ]
        )
    assert empty.error_code == ErrorCode.invalid_request
    assert (
        zero.error_code
        == negative.error_code
        == too_long.error_code
        == (ErrorCode.invalid_transaction_timeout)
    )
    assert (at_max.error_code, at_max.producer_epoch) == (ErrorCode.none, 0)
    assert (empty.producer_id, empty.producer_epoch) == (-1, -1)


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("pair", [(-1, 0), (5, -1)])
@pytest.mark.parametrize("transactional_id", [None, "tx"])
def test_exactly_one_of_pid_and_epoch_is_invalid_request(
    server: ServerProcess, version: int, pair: tuple[int, int], transactional_id: str | None
) -> None:
    request = requests.init_producer_id(
        transactional_id, producer_id=pair[0], producer_epoch=pair[1], version=version
    )
    with SyncClient(server.bootstrap) as client:
        assert client.request(request).error_code == ErrorCode.invalid_request


@pytest.mark.parametrize("version", range(6))
def test_reinit_bumps_epoch_and_keeps_pid(server: ServerProcess, version: int) -> None:
    with SyncClient(server.bootstrap) as client:
        first, second, third = client.pipeline(
            [requests.init_producer_id("tx-bump", version=version)] * 3
        )
    assert first.producer_id == second.producer_id == third.producer_id
    assert [first.producer_epoch, second.producer_epoch, third.producer_epoch] == [0, 1, 2]


@pytest.mark.parametrize(
    ("version", "fenced"),
    [
        (3, ErrorCode.invalid_producer_epoch),
        (4, ErrorCode.producer_fenced),
        (5, ErrorCode.producer_fenced),
    ],
)
def test_kip360_bump_retry_and_fencing(
    server: ServerProcess, version: int, fenced: ErrorCode
) -> None:
    with SyncClient(server.bootstrap) as client:
        first = client.request(requests.init_producer_id("tx-360"))
        pid = first.producer_id
        bump = client.request(
            requests.init_producer_id("tx-360", producer_id=pid, producer_epoch=0, version=version)
        )
        assert (bump.error_code, bump.producer_id, bump.producer_epoch) == (0, pid, 1)
        retry = client.request(
            requests.init_producer_id("tx-360", producer_id=pid, producer_epoch=0, version=version)
        )
        assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (0, pid, 1)
        other = client.request(requests.init_producer_id("tx-360"))  # a new producer: epoch 2
        assert other.producer_epoch == 2
        stale = client.request(
            requests.init_producer_id("tx-360", producer_id=pid, producer_epoch=1, version=version)
        )
        assert (stale.error_code, stale.producer_id, stale.producer_epoch) == (fenced, -1, -1)
        wrong_pid = client.request(
            requests.init_producer_id(
                "tx-360", producer_id=pid + 1, producer_epoch=2, version=version
            )
        )
        assert wrong_pid.error_code == fenced


@pytest.mark.slow
def test_epoch_exhaustion_rotates_the_pid_over_the_wire(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap, timeout=120) as client:
        responses = client.pipeline([requests.init_producer_id("tx-exhaust")] * 32768)
    epochs = [r.producer_epoch for r in responses]
    pids = [r.producer_id for r in responses]
    assert all(r.error_code == 0 for r in responses)
    assert epochs[:32767] == list(range(32767))  # 0 .. 32766: 32767 is never seen
    assert pids[:32767] == [pids[0]] * 32767
    assert (epochs[32767], pids[32767] != pids[0]) == (0, True)
    assert max(epochs) == 32766


def test_kip360_rotation_retry(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap, timeout=120) as client:
        responses = client.pipeline([requests.init_producer_id("tx-rot")] * 32767)
        old_pid, last = responses[-1].producer_id, responses[-1].producer_epoch
        assert last == 32766
        rotated = client.request(
            requests.init_producer_id("tx-rot", producer_id=old_pid, producer_epoch=32766)
        )
        assert rotated.producer_id != old_pid and rotated.producer_epoch == 0
        retry = client.request(
            requests.init_producer_id("tx-rot", producer_id=old_pid, producer_epoch=32766)
        )
        assert (retry.producer_id, retry.producer_epoch) == (rotated.producer_id, 0)


def test_restart_between_bump_and_retry(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d") as server:
        with SyncClient(server.bootstrap) as client:
            pid = client.request(requests.init_producer_id("tx-r")).producer_id
            bump = client.request(
                requests.init_producer_id("tx-r", producer_id=pid, producer_epoch=0)
            )
        server.kill()
        server.start()
        with SyncClient(server.bootstrap) as client:
            retry = client.request(
                requests.init_producer_id("tx-r", producer_id=pid, producer_epoch=0)
            )
    assert (bump.producer_id, bump.producer_epoch) == (pid, 1)
    assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (0, pid, 1)


def test_kill_after_each_response_never_repeats_an_epoch(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    server = ServerProcess(tmp_path / "d")
    try:
        for _ in range(6):
            server.start()
            with SyncClient(server.bootstrap) as client:
                r = client.request(requests.init_producer_id("tx-kill"))
                seen.append((r.producer_id, r.producer_epoch))
            server.kill()  # right after the response reached the client
    finally:
        server.kill()
    assert len(set(seen)) == len(seen)
    assert [e for _, e in seen] == list(range(6))


def test_concurrent_first_uses_yield_one_pid(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap) as a, SyncClient(server.bootstrap) as b:
        import threading

        results: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def init(name: str, client: SyncClient) -> None:
            barrier.wait()
            results[name] = client.request(requests.init_producer_id("tx-race"))

        threads = [threading.Thread(target=init, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    ra, rb = results["a"], results["b"]
    assert ra.producer_id == rb.producer_id  # type: ignore[attr-defined]
    assert {ra.producer_epoch, rb.producer_epoch} == {0, 1}  # type: ignore[attr-defined]


def test_idempotent_pool_blocks_are_logged_and_prefetched(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap) as client:
        pids = [r.producer_id for r in client.pipeline([requests.init_producer_id()] * 950)]
    assert pids == list(range(950))

    def granted() -> list[str]:
        return [line for line in dump_lines(server.data_dir, False) if "ProducerIdsGranted" in line]

    # No answer waits for the prefetch's grant (its PIDs are the next block's), so it may
    # reach the log just after the last answer.
    wait_until(lambda: len(granted()) >= 2, "the prefetched block's grant in the log")
    grants = granted()
    assert len(grants) == 2  # the first block, and the next one fetched at 90% use
    assert all("holder=controller" in g for g in grants)


def test_idempotent_pids_never_collide_with_broker_blocks_across_restarts(
    tmp_path: Path,
) -> None:
    pids: list[int] = []
    blocks: list[tuple[int, int]] = []
    with ServerProcess(tmp_path / "d") as server:
        cluster = server.cluster_id()
        with SyncClient(server.bootstrap) as client:
            epoch = wire.register(client, 1, cluster)
        for _ in range(3):
            with SyncClient(server.bootstrap) as client:
                for _ in range(5):
                    pids.extend(
                        r.producer_id
                        for r in client.pipeline([requests.init_producer_id(None)] * 300)
                    )
                    grant = client.request(wire.allocate(1, epoch))
                    blocks.append((grant.producer_id_start, grant.producer_id_len))
            server.kill()
            server.start()
    wire.assert_pids_outside_blocks(pids, blocks)


def test_idempotent_pool_exhausted_is_coordinator_load_in_progress(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d", "--last-producer-id", "999")
    with server, SyncClient(server.bootstrap) as client:
        responses = client.pipeline([requests.init_producer_id()] * 1001)
        transactional = client.request(requests.init_producer_id("tx-late"))
    assert all(r.error_code == 0 for r in responses[:1000])
    assert responses[1000].error_code == ErrorCode.coordinator_load_in_progress
    assert transactional.error_code == ErrorCode.coordinator_load_in_progress


def test_transactional_ids_expire(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "d",
        "--transactional-id-expiration-ms",
        "300",
        "--transactional-id-cleanup-interval-ms",
        "100",
    )
    with server, SyncClient(server.bootstrap) as client:
        old = client.request(requests.init_producer_id("tx-exp"))
        deadline = time.monotonic() + 10
        while not any(
            "TransactionalIdExpired" in line for line in dump_lines(server.data_dir, False)
        ):
            assert time.monotonic() < deadline, "no expiry record was written"
            time.sleep(0.1)
        new = client.request(requests.init_producer_id("tx-exp"))
    assert new.producer_id != old.producer_id and new.producer_epoch == 0


@pytest.mark.parametrize("version", range(14))
def test_metadata_every_version(tmp_path: Path, version: int) -> None:
    with ServerProcess(
        tmp_path / "d", "--advertised-listener", "pidctl.example:19093", "--node-id", "7"
    ) as server:
        with SyncClient(server.bootstrap) as client:
            named, everything = client.pipeline(
                [
                    requests.metadata(["orders", "payments"], version=version),
                    requests.metadata(None if version else [], version=version),
                ]
            )
        cluster = server.cluster_id()
    for response in (named, everything):
        [broker] = response.brokers
        assert (broker.node_id, broker.host, broker.port) == (7, "pidctl.example", 19093)
        if version >= 1:
            assert response.controller_id == 7
        if version >= 2:
            assert response.cluster_id == cluster
    # In the order of Kafka's java.util.HashSet of the names, as Kafka lists them.
    assert [(t.name, t.error_code) for t in named.topics] == [
        ("payments", ErrorCode.unknown_topic_or_partition),
        ("orders", ErrorCode.unknown_topic_or_partition),
    ]
    assert everything.topics == ()


@pytest.mark.parametrize("version", range(7))
def test_find_coordinator_every_version(server: ServerProcess, version: int) -> None:
    with SyncClient(server.bootstrap) as client:
        response = client.request(requests.find_coordinator("tx-1", version=version))
        bad = client.request(requests.find_coordinator("tx-1", 9, version=version))
    if version >= 4:
        [entry] = response.coordinators
        assert (entry.key, entry.error_code, entry.node_id) == ("tx-1", 0, 1)
        assert (entry.host, entry.port) == ("127.0.0.1", server.port)
        assert bad.coordinators[0].error_code == ErrorCode.invalid_request
    else:
        assert (response.error_code, response.node_id, response.port) == (0, 1, server.port)
        if version >= 1:
            assert bad.error_code == ErrorCode.invalid_request


def _libfaketime() -> str:
    """libfaketime (Debian's faketime, which ops/dev.sh installs)."""
    import glob

    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert found, "libfaketime missing: apt-get install faketime (ops/dev.sh does)"
    return found[0]


def test_a_wall_clock_before_1970_serves_transactional_ids(tmp_path: Path) -> None:
    # The server's wall clock starts in June 1969 (libfaketime); its monotonic clock is real.
    before_1970 = {
        "LD_PRELOAD": _libfaketime(),
        "FAKETIME": "@1969-06-01 00:00:00",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    with ServerProcess(tmp_path / "d", env=before_1970) as server:
        with SyncClient(server.bootstrap) as client:
            first = client.request(requests.init_producer_id("tx"))
            again = client.request(requests.init_producer_id("tx"))
            assert (first.error_code, again.error_code) == (0, 0)  # it closed the connection
            assert again.producer_id == first.producer_id
            assert again.producer_epoch == first.producer_epoch + 1
        assert not any(e.get("event") == "connection failed" for e in server.events)
