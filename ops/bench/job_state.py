"""A good client beside a million named job app ids, against the same load beside none.

    python -m ops.bench.job_state [--app-ids 1000000] [--principals 1000] [--seconds 60]
                                  [--connections 16] [--build compiled|interpreted]

Two data dirs are written through the real log, decided by the real job manager
(``JobAllocationManager.allocate``: a grant and a ``JobBlockRecorded`` per app id, the app
ids spread over ``--principals`` owners): the baseline's with no app id, the measured one's
with ``--app-ids``. Each is then served by a real ``pidctl serve`` (the ``--build`` this
run names) and loaded the same way: ``--connections`` brokers allocating durable blocks,
one request in flight each, for ``--seconds`` (``ops.bench.loadgen``, its own process). The
load writes enough records for snapshots to come due under their own rules (a snapshot
waits until the log has grown by the last one's size: with a million app ids, about one
every 20-30 s of this load), so the measured window holds snapshots of the whole job state.

Reports each run's latencies (p50, p99, p99.9, max, requests over 100 ms), the snapshots
written during the load, the ratio of the measured p99 to the baseline's, the server's RSS
per app id (after the same warm-up, ``ops/bench/memory.py``) and the snapshot's bytes per
app id. One JSON object on standard output.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from ops.bench.common import add_build_argument, rss_kib, run_json, use_build
from ops.bench.memory import warm_rss_kib
from ops.testing.serverproc import ServerProcess
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.records import ClusterCreated
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import MetadataLog

#: Settings of both servers: the audit trail not kept (only the snapshots' cost is
#: measured), everything else the defaults.
SERVE = ("--log-retention-bytes", "0", "--log-retention-ms", "0")


def app_id(index: int) -> str:
    """The ``index``-th app id: 36 characters, as a Spark streaming query's id."""
    return f"query-{index:010d}-0000-0000-00000000"


def write_app_ids(data_dir: Path, count: int, principals: int) -> None:
    """A data dir holding ``count`` app ids (block 0 of version 1 each), written through the
    real log and decided by the real job manager."""
    data_dir.mkdir(parents=True)

    async def main() -> None:
        state = ControllerState().configure(max_job_app_ids_per_principal=count + 1)
        quorum: QuorumController
        metalog = MetadataLog(
            data_dir, 0, 0, lambda: quorum.snapshot(), retention_bytes=0, retention_ms=0
        )
        quorum = QuorumController(state, metalog)
        wall = int(time.time() * 1000)
        async with trio.open_nursery() as nursery:
            await nursery.start(metalog.run)
            now = Now(wall, 0)
            quorum.apply(ControllerResult((ClusterCreated("job-state-bench", 1),), None), now)
            for index in range(count):
                key = JobKey(app_id(index), 1, 0)
                now = Now(wall + index // 1000, index // 1000)
                result = state.jobs.allocate(
                    key,
                    wall_ms=now.wall_ms,
                    mono_ms=now.mono_ms,
                    principal=f"User:tenant-{index % principals}",
                    client_id=key.client_id(),
                )
                quorum.apply(result, now)
                if index % 5000 == 4999:
                    await metalog.flush()
            await metalog.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)


def measure(
    data_dir: Path, connections: int, seconds: float, broker_base: int, snapshot_every: int
) -> dict[str, Any]:
    """Serve ``data_dir``, warm the server up, load it; the load's figures and the server's."""
    interval = ("--snapshot-interval-records", str(snapshot_every))
    server = ServerProcess(data_dir, *SERVE, *interval).start(timeout=600)
    try:
        assert server.proc is not None
        rss = warm_rss_kib(server)
        before = sum(e.get("event") == "snapshot written" for e in server.events)
        load = run_json(
            "ops.bench.loadgen",
            server.bootstrap,
            "--scenario",
            "allocate",
            "--connections",
            str(connections),
            "--seconds",
            str(seconds),
            "--broker-base",
            str(broker_base),
        )
        snapshots = sum(e.get("event") == "snapshot written" for e in server.events) - before
        rss_after = rss_kib(server.proc.pid)
        recovered = server.event("log recovered")
    finally:
        server.kill()
    newest = max(data_dir.glob("*.snapshot"), key=lambda p: p.stat().st_mtime, default=None)
    return {
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in load.items()},
        "snapshots_during_load": snapshots,
        "rss_mib": round(rss / 1024, 1),
        "rss_after_load_mib": round(rss_after / 1024, 1),
        "snapshot_bytes": newest.stat().st_size if newest is not None else 0,
        "recovery_s": recovered["seconds"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app-ids", type=int, default=1_000_000)
    parser.add_argument("--principals", type=int, default=1000, help="owners of the app ids")
    parser.add_argument("--seconds", type=float, default=60.0, help="of load, each run")
    parser.add_argument("--connections", type=int, default=16, help="brokers of the load")
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=10_000,
        help="the server's snapshot_interval_records (records; default 10,000, as shipped): "
        "a short run on a slow machine asks for fewer, so that its window holds snapshots",
    )
    add_build_argument(parser)
    args = parser.parse_args(argv)
    # The log written here says what it does on standard error: standard output is the JSON.
    # Restored afterwards: run in-process (its test), a factory bound to this sys.stderr
    # would outlive it, and every later log line would meet a closed file.
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        _run(args)
    finally:
        structlog.configure(**saved)


def _run(args: argparse.Namespace) -> None:
    build = use_build(args.build)
    result: dict[str, Any] = {"build": build, "app_ids": args.app_ids}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        write_app_ids(Path(tmp) / "baseline", 0, args.principals)
        write_app_ids(Path(tmp) / "app-ids", args.app_ids, args.principals)
        result["seconds_to_write"] = round(time.monotonic() - started, 1)
        base = measure(
            Path(tmp) / "baseline", args.connections, args.seconds, 10_000, args.snapshot_every
        )
        loaded = measure(
            Path(tmp) / "app-ids", args.connections, args.seconds, 20_000, args.snapshot_every
        )
    result["baseline"], result["with_app_ids"] = base, loaded
    per_app = max(1, args.app_ids)
    result["p99_ratio"] = round(loaded["p99_ms"] / base["p99_ms"], 2)
    result["p999_ratio"] = round(loaded["p999_ms"] / base["p999_ms"], 2)
    result["rss_bytes_per_app_id"] = round((loaded["rss_mib"] - base["rss_mib"]) * 2**20 / per_app)
    result["snapshot_bytes_per_app_id"] = round(
        (loaded["snapshot_bytes"] - base["snapshot_bytes"]) / per_app, 1
    )
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
