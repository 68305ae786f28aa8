"""Benchmark of the durable allocation core, with baselines measured in the same run.

    python -m ops.bench.core [--grants-seconds 5] [--history 1000000]

Reports:
- restart-to-listening time of `pidctl serve` with 10 and with N grants in history (the
  10-grant restart is the baseline: snapshots should make the ratio about 1);
- durable AllocateProducerIds per second from 1 and 16 concurrent brokers (the load
  generator's allocate scenario in its own process, one request in flight per broker),
  against the disk
  baseline: grant-sized appends with one fdatasync each, on the same file system.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from ops.bench.common import ROOT, exit_on_sigterm, run_json
from ops.testing.serverproc import ServerProcess, without_hypothesis
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    ProducerIdsGranted,
    Record,
)
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import MetadataLog


def append_history(quorum: QuorumController, records: Sequence[Record], now: Now) -> int:
    """A benchmark's hand-made history: records no manager decided (the server never writes
    such), replayed and appended by :meth:`QuorumController.apply`; the offset to wait for."""
    return quorum.apply(ControllerResult(tuple(records), None), now)[1]


def build_history(data_dir: Path, grants: int, snapshot_interval_records: int = 10_000) -> None:
    """Write a data dir holding `grants` grants through the real log (and its snapshots)."""
    data_dir.mkdir(parents=True)

    async def main() -> None:
        state = ControllerState()
        quorum: QuorumController
        metalog = MetadataLog(
            data_dir,
            0,
            0,
            lambda: quorum.snapshot(),
            snapshot_interval_records=snapshot_interval_records,
        )
        quorum = QuorumController(state, metalog)
        now = Now(int(time.time() * 1000), 0)
        async with trio.open_nursery() as nursery:
            await nursery.start(metalog.run)
            append_history(quorum, [ClusterCreated("bench-cluster", 1)], now)
            append_history(quorum, [BrokerRegistered(1, "inc", state.next_offset)], now)
            for done in range(grants):
                first = state.next_producer_id
                append_history(quorum, [ProducerIdsGranted(1, 1, first, first + 1000)], now)
                if done % 5000 == 4999:
                    await metalog.flush()
            await metalog.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)


def time_restart(data_dir: Path) -> tuple[float, float]:
    """Seconds from spawning `pidctl serve` to its listening line, and recovery seconds."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=without_hypothesis(os.environ),  # as installed: no hypothesis to import
    )
    assert proc.stderr is not None
    recovery = float("nan")
    for line in proc.stderr:
        event = json.loads(line)
        if event["event"] == "log recovered":
            recovery = event["seconds"]
        if event["event"] == "listening":
            elapsed = time.monotonic() - started
            break
    proc.terminate()
    proc.wait(30)
    return elapsed, recovery


def disk_rate(directory: Path, group: int, seconds: float) -> float:
    """Grant-sized (150 byte) appends with one fdatasync per ``group`` of them, per second."""
    record = b"x" * 150
    fd = os.open(directory / f"disk-{group}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        os.write(fd, record * group)
        os.fdatasync(fd)
        count += group
    os.close(fd)
    return count / seconds


def grants_per_second(bootstrap: str, brokers: int, seconds: float) -> float:
    """Durable AllocateProducerIds per second from ``brokers`` brokers (the load generator's
    allocate scenario, in its own process; fresh broker ids for each run)."""
    result = run_json(
        "ops.bench.cloadgen",
        bootstrap,
        "--scenario",
        "allocate",
        "--connections",
        str(brokers),
        "--seconds",
        str(seconds),
        "--broker-base",
        str(1000 * brokers),
    )
    return float(result["per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grants-seconds", type=float, default=5.0)
    parser.add_argument("--history", type=int, default=1_000_000)
    args = parser.parse_args()

    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        base = Path(tmp)
        small, large = base / "small", base / "large"
        build_history(small, 10)
        t0 = time.monotonic()
        build_history(large, args.history)
        print(f"built {args.history} grants in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        small_t = min(time_restart(small) for _ in range(3))
        large_t = min(time_restart(large) for _ in range(3))
        rows.append(
            (
                "restart, 10 grants (baseline)",
                f"{small_t[0]:.3f} s",
                f"recovery {small_t[1] * 1000:.1f} ms",
            )
        )
        ratio = large_t[0] / small_t[0]
        rows.append(
            (
                f"restart, {args.history:,} grants",
                f"{large_t[0]:.3f} s",
                f"recovery {large_t[1] * 1000:.1f} ms; ratio {ratio:.2f}x",
            )
        )

        disk = disk_rate(base, 1, args.grants_seconds)
        rows.append(("disk: 150 B append + fdatasync each (baseline)", f"{disk:,.0f} /s", ""))

        with ServerProcess(base / "live") as server:
            for brokers in (1, 16):
                rate = grants_per_second(server.bootstrap, brokers, args.grants_seconds)
                rows.append(
                    (
                        f"durable grants, {brokers} broker(s)",
                        f"{rate:,.0f} /s",
                        f"{rate / disk:.2f}x the fsync-per-append disk rate",
                    )
                )
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>12}  {note}")


if __name__ == "__main__":
    exit_on_sigterm()
    main()
