"""A named job version gets the same blocks back from a real server, across a SIGKILL and a
restart (the allocation is in the log, and in snapshots); an older version is fenced, a
malformed key refused, and an expired app id is forgotten with a logged record."""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from ops.testing.serverproc import FREQUENT_SNAPSHOTS, ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.protocol import requests


def _blocks(bootstrap: str, app: str, version: int, count: int) -> list[tuple[int, int, int]]:
    """(error, start, length) of blocks 0..count-1, pipelined over one connection."""
    keys = [JobKey(app, version, block).client_id() for block in range(count)]
    with SyncClient(bootstrap) as client:
        answers = client.pipeline([requests.allocate(-1, -1)] * count, keys)
    return [(a.error_code, a.producer_id_start, a.producer_id_len) for a in answers]


def test_a_rerun_gets_the_same_blocks_across_a_crash(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A snapshot every 3 records (older segments removed): the allocation is restored from
    # a snapshot, not only replayed.
    reservation = 10_000
    settings = (
        *("--first-producer-id", str(2**62), "--snapshot-interval-records", "3"),
        *FREQUENT_SNAPSHOTS,
        *("--producer-id-reservation", str(reservation)),
    )
    with ServerProcess(data, *settings) as server:
        first = _blocks(server.bootstrap, "nightly", 5, 3)
        assert [start for _, start, _ in first] == [2**62, 2**62 + 1000, 2**62 + 2000]
        server.kill()
        server.start()
        assert _blocks(server.bootstrap, "nightly", 5, 3) == first
        # One more: a new block, from above the reservation the first grant took (a start-up
        # after a crash skips it, docs/log-format.md "Reservations").
        resumed = 2**62 + 1000 + reservation
        assert _blocks(server.bootstrap, "nightly", 5, 4)[3][1] == resumed
        assert _blocks(server.bootstrap, "nightly", 4, 1) == [(ErrorCode.producer_fenced, 0, 0)]
        with SyncClient(server.bootstrap, client_id="pidctl-job/x/0/nightly") as client:
            refused = client.request(requests.allocate(-1, -1))
        assert refused.error_code == ErrorCode.invalid_request
        # A job without a key is unchanged: a fresh block each time.
        with SyncClient(server.bootstrap, client_id="local-17") as client:
            assert client.request(requests.allocate(-1, -1)).producer_id_start == resumed + 1000


def test_reuse_window_and_expiry(tmp_path: Path) -> None:
    """Past job_allocation_reuse_ms a re-run is refused UNKNOWN_PRODUCER_ID; past
    job_allocation_expiration_ms the cleanup forgets the app id and says so."""
    settings = (
        "--job-allocation-reuse-ms",
        "300",
        "--job-allocation-expiration-ms",
        "600",
        "--transactional-id-cleanup-interval-ms",
        "100",
    )
    with ServerProcess(tmp_path / "data", *settings) as server:
        ((error, start, _),) = _blocks(server.bootstrap, "short", 1, 1)
        assert error == ErrorCode.none

        def refused() -> bool:
            return _blocks(server.bootstrap, "short", 1, 1)[0][0] == ErrorCode.unknown_producer_id

        wait_until(refused, "the re-run refused past the reuse window", timeout=30)
        wait_until(
            lambda: any(e.get("event") == "job allocations expired" for e in server.events),
            "the app id expired",
            timeout=30,
        )
        # Forgotten: version 0 is no longer fenced, and gets a new block.
        ((error, again, _),) = _blocks(server.bootstrap, "short", 0, 1)
        assert (error, again) == (ErrorCode.none, start + 1000)
