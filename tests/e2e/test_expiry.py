"""Transactional-id expiry costs what expires, in bounded steps between other work: a real
data dir of many ids, a real server expiring them, and a well-behaved client's durable
InitProducerIds timed meanwhile against its own baseline of the same run."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops.bench.suite import build_transactional_ids
from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests import latency

#: Transactional ids in the data dir: one scan of them took ~0.5 s of the event loop, and
#: expiring them in one piece several seconds.
IDS = 300_000
#: A durable InitProducerId every this often (paced: see latency.measure_paced).
INTERVAL_S = 0.01


def _durable_inits(client: SyncClient, prefix: str) -> Callable[[], None]:
    """A transactional InitProducerId for a new id each call: one durable record each."""
    numbers = itertools.count()

    def init() -> None:
        answer = client.request(requests.init_producer_id(f"{prefix}-{next(numbers)}"))
        assert answer.error_code == 0, answer

    return init


#: Recovering the ids takes a while on a busy machine: the server's start may take this long.
START_TIMEOUT_S = 180.0


@contextlib.contextmanager
def _started(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start(timeout=START_TIMEOUT_S)
    try:
        yield server
    finally:
        server.kill()


def _expired(server: ServerProcess) -> int:
    return sum(e["count"] for e in server.events if e.get("event") == "transactional ids expired")


#: The most CPU one expiry step of ``transactional_id_expiry_batch`` (1,000) ids may take on
#: the server's event loop (measured there: thread CPU time, which a busy machine does not
#: stretch): no more than a well-behaved client's whole latency bound. A step took 45 ms
#: here, expiring every id at once several seconds.
STEP_CPU_BOUND_MS = latency.LATENCY_BOUND_S * 1000


@pytest.mark.slow
def test_expiry_costs_what_expires_in_bounded_steps(tmp_path: Path) -> None:
    data_dir = tmp_path / "ids"
    build_transactional_ids(data_dir, IDS)
    # The baseline: a fresh server, asked beside the server under test at the same time (a
    # machine turning busy, or a disk stalling, slows both).
    with ServerProcess(tmp_path / "fresh") as fresh, SyncClient(fresh.bootstrap) as plain:
        baseline_init = _durable_inits(plain, "baseline")

        # Nothing to expire, a cleanup every 100 ms: each scanned every id.
        scanning = ServerProcess(data_dir, "--transactional-id-cleanup-interval-ms", "100")
        with _started(scanning) as server, SyncClient(server.bootstrap) as client:
            idle, idle_baseline = latency.measure_paced_beside(
                _durable_inits(client, "idle"), baseline_init, INTERVAL_S, 300, lambda: True
            )
            assert _expired(server) == 0

        # Every id expires at the first cleanup, half a second after the start.
        expiring = ServerProcess(
            data_dir,
            "--transactional-id-expiration-ms",
            "1",
            "--transactional-id-cleanup-interval-ms",
            "500",
        )
        with _started(expiring) as server, SyncClient(server.bootstrap) as client:
            during, during_baseline = latency.measure_paced_beside(
                _durable_inits(client, "during"),
                baseline_init,
                INTERVAL_S,
                300,
                lambda: _expired(server) >= IDS,
            )
            steps = [e for e in server.events if e.get("event") == "transactional ids expired"]
    print(
        f"durable InitProducerId p99: {idle.p99 * 1000:.1f} ms beside {IDS:,} ids with cleanups "
        f"every 100 ms (a fresh server meanwhile {idle_baseline.p99 * 1000:.1f} ms), "
        f"{during.p99 * 1000:.1f} ms (worst {during.worst * 1000:.1f} ms) while they expire "
        f"(fresh {during_baseline.p99 * 1000:.1f} ms); the longest step's CPU "
        f"{max(step['longest_step_cpu_ms'] for step in steps)} ms"
    )
    assert sum(step["count"] for step in steps) >= IDS
    assert max(step["steps"] for step in steps) > 1  # in steps, not in one piece
    assert max(step["longest_step_cpu_ms"] for step in steps) < STEP_CPU_BOUND_MS
    assert idle.p99 < latency.bound(idle_baseline), (idle.p99, idle_baseline.p99)
    assert during.p99 < latency.bound(during_baseline), (during.p99, during_baseline.p99)
