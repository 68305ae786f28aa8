"""Named job versions across wall-clock steps, forwards and backwards, on the real server
under libfaketime: while it runs and across restarts. Each re-run of a version either gets
the blocks its first run got or is refused UNKNOWN_PRODUCER_ID, never other blocks; nothing
expires because the wall clock jumped; a transactional id never gets the same (PID, epoch)
twice.

libfaketime shifts the server's wall clock by what a file says, read again every second
(``FAKETIME_TIMESTAMP_FILE``); the monotonic clock is left alone (``DONT_FAKE_MONOTONIC``),
as an operator's ``date -s`` or an NTP step leaves it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.records import JobAllocationExpired, ProducerIdsGranted
from pidctl.controller.log.recovery import read_log
from pidctl.protocol import requests

pytestmark = pytest.mark.slow

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
DAY_MS = 86_400_000
REFUSED = [ErrorCode.unknown_producer_id] * 3


class SteppedServer:
    """A server whose wall clock is ``offset_days`` off, changed at will."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock_file = tmp_path / "faketime"
        self.clock_file.write_text("+0\n")
        env = {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
            "FAKETIME_CACHE_DURATION": "1",
            "DONT_FAKE_MONOTONIC": "1",
        }
        # Expiry looks often: a wall clock set ahead must not make it forget anything.
        self.server = ServerProcess(
            tmp_path / "data", "--transactional-id-cleanup-interval-ms", "200", env=env
        )
        self.offset_days = 0
        self.pairs: list[tuple[int, int]] = []  # every (PID, epoch) "tx" was given

    def step(self, days: int) -> None:
        """Set the wall clock ``days`` off real time, and wait until the server runs on it
        (a grant's record is dated so)."""
        self.offset_days = days
        self.clock_file.write_text(f"{days:+d}d\n")
        if self.server.proc is not None and self.server.proc.poll() is None:
            wait_until(self._dated_as_set, f"the server's clock {days:+d} days", timeout=30)

    def _dated_as_set(self) -> bool:
        with SyncClient(self.server.bootstrap) as client:
            client.request(requests.allocate(-1, -1))  # a job without a name: one grant
        grants = [
            e
            for e in read_log(self.server.data_dir).entries()
            if isinstance(e.record, ProducerIdsGranted)
        ]
        expected = time.time() * 1000 + self.offset_days * DAY_MS
        return abs(grants[-1].timestamp_ms - expected) < 60_000

    def restart(self) -> None:
        self.server.kill()
        self.server.start()
        self.step(self.offset_days)

    def blocks(self, app: str, version: int = 1) -> list[tuple[int, int]]:
        keys = [JobKey(app, version, block).client_id() for block in range(3)]
        with SyncClient(self.server.bootstrap) as client:
            answers = client.pipeline([requests.allocate(-1, -1)] * 3, keys)
            tx = client.request(requests.init_producer_id("tx"))
        assert tx.error_code == 0
        self.pairs.append((tx.producer_id, tx.producer_epoch))
        return [(a.error_code, a.producer_id_start) for a in answers]


def _errors(answers: list[tuple[int, int]]) -> list[int]:
    return [error for error, _ in answers]


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime is not installed")
def test_clock_steps_both_ways_never_change_a_versions_blocks(tmp_path: Path) -> None:
    stepped = SteppedServer(tmp_path)
    stepped.server.start()
    try:
        first = {"a": stepped.blocks("a")}
        assert _errors(first["a"]) == [0, 0, 0]

        # Forwards 400 days while running: "a" looks 400 days old (refused, not forgotten);
        # "b" is recorded, dated ahead.
        stepped.step(400)
        assert _errors(stepped.blocks("a")) == REFUSED
        first["b"] = stepped.blocks("b")
        assert _errors(first["b"]) == [0, 0, 0]
        time.sleep(1)  # expiry runs (every 200 ms) with the clock 400 days ahead

        # Put right: "a" is answered as before; "b" has an unknown age (dated ahead).
        stepped.step(0)
        assert stepped.blocks("a") == first["a"]
        assert _errors(stepped.blocks("b")) == REFUSED

        # Backwards 30 days while running: job time does not go back, "a" is as before; "c"
        # is dated by job time, not by the clock set back.
        stepped.step(-30)
        assert stepped.blocks("a") == first["a"]
        first["c"] = stepped.blocks("c")
        assert stepped.blocks("c") == first["c"]

        # A restart while the clock is behind the newest job record: what was recorded
        # before it has an unknown age (refused); a new version is timed as usual.
        stepped.restart()
        assert _errors(stepped.blocks("a")) == REFUSED
        assert _errors(stepped.blocks("c")) == REFUSED
        first["d"] = stepped.blocks("d")
        assert stepped.blocks("d") == first["d"]

        # A restart on time: "a" and "c" as before (minutes old); "d", dated 30 days back,
        # is past the reuse window (refused); "b" still ahead.
        stepped.step(0)
        stepped.restart()
        assert stepped.blocks("a") == first["a"]
        assert stepped.blocks("c") == first["c"]
        assert _errors(stepped.blocks("d")) == REFUSED
        assert _errors(stepped.blocks("b")) == REFUSED

        # A restart 400 days ahead, expiry running: nothing forgotten; on time again, "a"
        # is answered as before.
        stepped.step(400)
        stepped.restart()
        assert _errors(stepped.blocks("a")) == REFUSED
        time.sleep(1)
        stepped.step(0)
        stepped.restart()
        assert stepped.blocks("a") == first["a"]
        assert stepped.blocks("c") == first["c"]
    finally:
        stepped.server.kill()
    records = [entry.record for entry in read_log(stepped.server.data_dir).entries()]
    assert not any(isinstance(r, JobAllocationExpired) for r in records)
    assert len(set(stepped.pairs)) == len(stepped.pairs)  # never the same (PID, epoch) twice
    # The versions' blocks are all different PIDs.
    starts = [start for answers in first.values() for _, start in answers]
    assert len(set(starts)) == len(starts)
