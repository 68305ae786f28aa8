"""Memory per transactional id of a real ``pidctl serve``, fresh and after restarts.

One run, one data dir, one server binary::

    python -m ops.bench.memory --ids 100000

1. ``empty``: a fresh server (snapshots every ``--snapshot-interval-records``, the server's
   default, and every segment kept), warmed up with idempotent InitProducerIds (no
   transactional id); its RSS is the baseline every figure below is measured against.
2. ``fresh``: the same process after ``--ids`` transactional InitProducerIds through the
   wire (each a new id, so one durable record each).
3. ``restart_log``: a server started on a copy of the data dir without its snapshots
   (``<data dir>-log-only``): recovery replays every record of the log.
4. ``restart_snapshot``: a server started on the data dir: recovery loads the newest
   snapshot and replays the records after it (if the run made no snapshot, one start with an
   interval of one record makes one first).

Every server is warmed up the same way before its RSS is read. Bytes per id is
``(rss - empty_rss) / ids``. ``--tracemalloc`` adds what Python itself holds per id after
recovering the data dir in this process, and the allocation sites that hold most of it.
Standard output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from ops.bench.common import rss_kib
from ops.testing.serverproc import NO_SNAPSHOTS, ServerProcess, wait_until
from pidctl.protocol import requests
from pidctl.protocol.client import ClientProtocol


def transactional_id(index: int) -> str:
    """The ``index``-th transactional id: 12 characters, like ``app-00000042``."""
    return f"app-{index:08d}"


async def _connection(
    host: str, port: int, ids: range, in_flight: int, transactional: bool
) -> None:
    stream = await trio.open_tcp_stream(host, port)
    protocol = ClientProtocol("bench-memory")
    pending = iter(ids)
    async with stream:

        async def send_next() -> None:
            index = next(pending, None)
            if index is not None:
                tid = transactional_id(index) if transactional else None
                _, data = protocol.send(requests.init_producer_id(tid))
                await stream.send_all(data)

        for _ in range(in_flight):
            await send_next()
        while protocol.outstanding:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            for _, response in protocol.receive(data):
                if response.error_code == 14:  # no PID ready yet: the same id again
                    raise RuntimeError("COORDINATOR_LOAD_IN_PROGRESS; rerun with less in flight")
                if response.error_code != 0:
                    raise RuntimeError(f"unexpected error {response.error_code!r}")
                await send_next()


def init_producer_ids(
    bootstrap: str,
    count: int,
    *,
    transactional: bool,
    connections: int = 8,
    in_flight: int = 16,
) -> None:
    """``count`` InitProducerIds over ``connections`` connections; with ``transactional``,
    for the ids ``transactional_id(0 .. count-1)``, each once."""
    host, port = bootstrap.rsplit(":", 1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for c in range(connections):
                ids = range(c, count, connections)
                nursery.start_soon(_connection, host, int(port), ids, in_flight, transactional)

    trio.run(main)


WARM_UP_REQUESTS = 2_000


def warm_rss_kib(server: ServerProcess) -> int:
    """The server's RSS after the same warm-up every measured server gets: idempotent
    InitProducerIds (they create no transactional id) over the benchmark's connections."""
    init_producer_ids(server.bootstrap, WARM_UP_REQUESTS, transactional=False)
    assert server.proc is not None
    return rss_kib(server.proc.pid)


def recovered(server: ServerProcess) -> dict[str, Any]:
    """What the server's "log recovered" line said."""
    event = server.event("log recovered")
    return {k: event[k] for k in ("records_replayed", "snapshot_offset", "seconds")}


def traced(data_dir: Path, ids: int, top: int) -> dict[str, Any]:
    """Recover ``data_dir`` in this process under tracemalloc: the bytes Python holds per id
    once recovery's garbage is gone, and the ``top`` allocation sites holding them."""
    import gc
    import tracemalloc

    from pidctl.controller.log.recovery import recover

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    recovery = recover(data_dir)
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
    tracemalloc.stop()
    del recovery
    return {
        "traced_bytes_per_id": current / ids,
        "traced_peak_bytes_per_id": peak / ids,
        "top": [
            {"where": str(s.traceback[0]), "bytes_per_id": s.size_diff / ids, "count": s.count_diff}
            for s in stats[:top]
        ],
    }


def measure(
    data_dir: Path, ids: int, snapshot_interval: int, tracemalloc_top: int
) -> dict[str, Any]:
    rows: dict[str, Any] = {"ids": ids}
    timeout = 60 + ids / 5_000
    servers: list[ServerProcess] = []

    def serve(directory: Path, *settings: str) -> ServerProcess:
        servers.append(ServerProcess(directory, *settings).start(timeout=timeout))
        return servers[-1]

    def row(name: str, server: ServerProcess, **extra: Any) -> None:
        kib = warm_rss_kib(server)
        rows[name] = {
            "rss_mib": round(kib / 1024, 1),
            "bytes_per_id": round((kib - empty_kib) * 1024 / ids, 1),
            **extra,
        }
        server.terminate()

    try:
        # Every segment is kept (retention), so a copy without the snapshots replays it all.
        keep_all = ("--log-retention-bytes", str(10**15))
        interval = ("--snapshot-interval-records", str(snapshot_interval))
        server = serve(data_dir, *interval, *keep_all)
        empty_kib = warm_rss_kib(server)
        rows["empty_rss_mib"] = round(empty_kib / 1024, 1)
        started = time.monotonic()
        init_producer_ids(server.bootstrap, ids, transactional=True)
        row("fresh", server, seconds_to_create=round(time.monotonic() - started, 1))

        log_only = data_dir.with_name(data_dir.name + "-log-only")
        shutil.copytree(data_dir, log_only, ignore=shutil.ignore_patterns("*.snapshot", ".lock"))
        server = serve(log_only, *NO_SNAPSHOTS)
        row("restart_log", server, **recovered(server))

        if not any(data_dir.glob("*.snapshot")):
            # Fewer records than the interval: one start with an interval of one record (its
            # start-up record makes a snapshot due) writes one.
            server = serve(data_dir, "--snapshot-interval-records", "1", *keep_all)
            wait_until(lambda: any(data_dir.glob("*.snapshot")), "a snapshot", timeout=timeout)
            server.terminate()
        server = serve(data_dir, *NO_SNAPSHOTS)
        row("restart_snapshot", server, **recovered(server))
    finally:
        for server in servers:
            server.kill()

    if tracemalloc_top:
        rows["tracemalloc"] = traced(data_dir, ids, tracemalloc_top)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=100_000, help="transactional ids to create")
    parser.add_argument(
        "--snapshot-interval-records",
        type=int,
        default=10_000,
        help="the first server's snapshot interval (the server's default: 10000)",
    )
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="TOP",
        help="also recover the data dir in this process and list the TOP allocation sites",
    )
    parser.add_argument("--data-dir", type=Path, help="keep the data dir here (must not exist)")
    args = parser.parse_args()
    if args.ids < 1:
        parser.error("--ids must be positive")
    if args.data_dir is not None:
        if args.data_dir.exists():
            parser.error(f"--data-dir {args.data_dir} already exists")
        result = measure(args.data_dir, args.ids, args.snapshot_interval_records, args.tracemalloc)
    else:
        with tempfile.TemporaryDirectory(prefix="pidctl-memory-") as tmp:
            result = measure(
                Path(tmp) / "data", args.ids, args.snapshot_interval_records, args.tracemalloc
            )
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
