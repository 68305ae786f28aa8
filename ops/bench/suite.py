"""Every benchmark scenario with its baselines, in one run: a table, a JSON file and a chart.

    python -m ops.bench.suite [--seconds 3] [--history 10000000] [--out ops/bench/results]

Baselines measured in the same run on the same machine:
- framing ceiling: ops/bench/ceiling.py answers every frame with a fixed pre-encoded response;
- disk: grant-sized appends with an fdatasync each, and one per group of 8 and of 64;
- the seed's design: blocks allocated by a conditional setData on ZooKeeper's
  /latest_producer_id_block (Debian's zookeeper, started here on loopback with a temporary
  data dir; python client kazoo), from 1, 4 and 16 concurrent allocators.
- a fleet (ops/bench/fleet.py): three controllers leasing from one etcd, and one leasing
  controller, against one controller alone;
- Spark (ops/bench/spark.py): preallocation against one InitProducerId per partition, and the
  exactly-once sink against a plain batched append (SQLite, PostgreSQL).
The load generator runs in its own process; it checks every response (ops/bench/loadgen.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ops.bench.common import ROOT, ceiling_server, rss_kib, run_json
from ops.bench.core import build_history, disk_rate, time_restart
from ops.testing.coordination import ZOOKEEPER, ZooKeeperProcess
from ops.testing.serverproc import ServerProcess

STORM_LIMITS = ("--max-connections", "30000", "--max-connections-per-address", "30000")


def loadgen(bootstrap: str, *args: str) -> dict[str, Any]:
    return run_json("ops.bench.loadgen", bootstrap, *args)


def zookeeper_allocations_per_second(hosts: str, allocators: int, seconds: float) -> float:
    """KIP-730's ZooKeeper scheme: read the latest block, write the next one with a
    conditional setData on its version, retry on conflict."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import BadVersionError

    path = "/latest_producer_id_block"
    granted: list[int] = []
    lock = threading.Lock()

    def allocator(broker: int) -> None:
        zk = KazooClient(hosts=hosts)
        zk.start(timeout=30)
        zk.ensure_path(path)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            data, stat = zk.get(path)
            end = json.loads(data)["block_end"] if data else "-1"
            start = int(end) + 1
            block = {
                "version": 1,
                "broker": broker,
                "block_start": str(start),
                "block_end": str(start + 999),
            }
            try:
                zk.set(path, json.dumps(block).encode(), version=stat.version)
            except BadVersionError:
                continue
            with lock:
                granted.append(start)
        zk.stop()

    threads = [threading.Thread(target=allocator, args=(b,)) for b in range(allocators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(set(granted)) != len(granted):
        raise RuntimeError("ZooKeeper baseline granted a block twice")
    return len(granted) / seconds


def build_transactional_ids(data_dir: Path, count: int) -> None:
    """A data dir holding ``count`` transactional ids, written through the real log."""
    import trio

    from pidctl.controller.api.handlers import Controller, Now
    from pidctl.controller.core.records import (
        ClusterCreated,
        ProducerIdsGranted,
        TransactionalIdUpdated,
    )
    from pidctl.controller.core.state import ControllerState
    from pidctl.controller.log.metalog import MetadataLog

    data_dir.mkdir(parents=True)

    async def main() -> None:
        state = ControllerState()
        controller: Controller
        metalog = MetadataLog(
            data_dir, 0, 0, lambda: controller.snapshot(), snapshot_interval_records=10**9
        )
        controller = Controller(state, metalog)
        now = Now(int(time.time() * 1000), 0)
        async with trio.open_nursery() as nursery:
            await nursery.start(metalog.run)
            controller.apply_records([ClusterCreated("bench", 1)], now)
            controller.apply_records(
                [ProducerIdsGranted(1, -1, 0, count, holder="controller")], now
            )
            for i in range(count):
                record = TransactionalIdUpdated(f"app-{i:08d}", i, 0, i, -1, 60_000, now.wall_ms)
                controller.apply_records([record], now)
                if i % 20_000 == 19_999:
                    await metalog.flush()
            await metalog.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--transactional-ids", type=int, default=1_000_000)
    parser.add_argument("--storm", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=ROOT / "ops" / "bench" / "results")
    args = parser.parse_args()
    from pidctl.controller.server.logs import configure_logging

    configure_logging("console", "warning")  # the in-process log builders stay quiet
    secs = str(args.seconds)
    results: dict[str, Any] = {"seconds_per_run": args.seconds, "rows": []}
    rows: list[dict[str, Any]] = results["rows"]

    def row(group: str, name: str, per_second: float | None, **extra: Any) -> None:
        rows.append({"group": group, "name": name, "per_second": per_second, **extra})
        shown = f"{per_second:>10,.0f}/s" if per_second is not None else " " * 12
        details = "  ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()
        )
        print(f"{group:<14} {name:<44} {shown}  {details}", flush=True)

    with tempfile.TemporaryDirectory(dir=ROOT) as tmp_name:
        tmp = Path(tmp_name)
        # -- framing ceiling and InitProducerId ------------------------------------------
        ceilings: dict[tuple[int, int], float] = {}
        with ceiling_server() as ceiling_addr, ServerProcess(tmp / "init", *STORM_LIMITS) as server:
            for conns in (1, 16, 64):
                for depth in (1, 8):
                    flags = [
                        "--connections",
                        str(conns),
                        "--in-flight",
                        str(depth),
                        "--seconds",
                        secs,
                    ]
                    base = loadgen(ceiling_addr, *flags, "--no-unique-check")
                    ceilings[(conns, depth)] = base["per_second"]
                    row(
                        "ceiling",
                        f"fixed answer, {conns} conn x {depth} in flight",
                        base["per_second"],
                        p50_ms=base["p50_ms"],
                        p99_ms=base["p99_ms"],
                        p999_ms=base["p999_ms"],
                    )
                    r = loadgen(server.bootstrap, *flags, "--scenario", "idempotent")
                    row(
                        "idempotent",
                        f"InitProducerId, {conns} conn x {depth} in flight",
                        r["per_second"],
                        p50_ms=r["p50_ms"],
                        p99_ms=r["p99_ms"],
                        p999_ms=r["p999_ms"],
                        vs_ceiling=r["per_second"] / base["per_second"],
                    )
            r = loadgen(
                server.bootstrap,
                "--connections",
                "16",
                "--seconds",
                secs,
                "--scenario",
                "transactional",
            )
            row(
                "transactional",
                "InitProducerId, 16 conn x 1 (each durable)",
                r["per_second"],
                p50_ms=r["p50_ms"],
                p99_ms=r["p99_ms"],
                p999_ms=r["p999_ms"],
                vs_ceiling=r["per_second"] / ceilings[(16, 1)],
            )

        # -- durable grants against the disk and ZooKeeper ----------------------------------
        disk = {g: disk_rate(tmp, g, args.seconds) for g in (1, 8, 64)}
        for g, rate in disk.items():
            row("disk", f"150 B appends, one fdatasync per {g}", rate)
        zk_rates: dict[int, float] = {}
        if ZOOKEEPER.exists():
            with ZooKeeperProcess(tmp / "zk") as zk:
                for n in (1, 4, 16):
                    zk_rates[n] = zookeeper_allocations_per_second(zk.hosts, n, args.seconds)
                    row("zookeeper", f"conditional setData, {n} allocators", zk_rates[n])
        with ServerProcess(tmp / "grants") as server:
            for n in (1, 4, 16):
                r = loadgen(
                    server.bootstrap,
                    "--connections",
                    str(n),
                    "--seconds",
                    secs,
                    "--scenario",
                    "allocate",
                    "--broker-base",
                    str(1000 * n),
                )
                extra: dict[str, Any] = {
                    "p50_ms": r["p50_ms"],
                    "p99_ms": r["p99_ms"],
                    "p999_ms": r["p999_ms"],
                    "vs_group_commit_64": r["per_second"] / disk[64],
                }
                if n in zk_rates:
                    extra["vs_zookeeper"] = r["per_second"] / zk_rates[n]
                row("grants", f"AllocateProducerIds, {n} brokers", r["per_second"], **extra)

        # -- a fleet of three controllers leasing from etcd -----------------------------------
        fleet = run_json("ops.bench.fleet", "--seconds", secs, "--brokers", "16")
        for key, name in (
            ("single_local", "1 controller, no etcd (baseline)"),
            ("single_etcd", "1 controller leasing from etcd"),
            ("fleet_of_3", "3 controllers leasing from one etcd"),
        ):
            r = fleet[key]
            extra = {
                "p99_ms": r["p99_ms"],
                "vs_single": r["grants_per_second"] / fleet["single_local"]["grants_per_second"],
            }
            if key == "fleet_of_3":
                extra["etcd_txns_per_million_pids"] = r["etcd_transactions_per_million_pids"]
            row(
                "fleet", f"AllocateProducerIds, 16 brokers: {name}", r["grants_per_second"], **extra
            )

        # -- Spark: driver-side preallocation and the exactly-once sink -----------------------
        spark = run_json("ops.bench.spark")
        driver = spark["driver"]
        row(
            "spark",
            "preallocate 1,000 partitions (1 request)",
            None,
            ms=driver["preallocate_1000_s"] * 1000,
            init_producer_id_each_ms=driver["init_producer_id_x1000_s"] * 1000,
        )
        row(
            "spark",
            "preallocate 100,000 partitions (100 pipelined)",
            None,
            ms=driver["preallocate_100000_s"] * 1000,
        )
        for backend in ("sqlite", "postgresql"):
            r = spark[backend]
            row(
                "spark",
                f"exactly-once sink, {backend}, rows/s",
                r["exactly_once_rows_per_s"],
                vs_plain_append=r["exactly_once_vs_plain"],
            )

        # -- start-up storm -------------------------------------------------------------------
        with ServerProcess(tmp / "storm", *STORM_LIMITS) as server:
            storm = loadgen(server.bootstrap, "--storm", str(args.storm))
        row(
            "storm",
            f"{args.storm:,} producers connect within 1 s",
            None,
            served=storm["served"],
            last_served_s=storm["last_served_s"],
            p50_s=storm["p50_s"],
            p99_s=storm["p99_s"],
            retries_14=storm["retries_14"],
        )

        # -- restart time and memory ---------------------------------------------------------
        for grants in (1_000, args.history):
            directory = tmp / f"history-{grants}"
            t0 = time.monotonic()
            build_history(directory, grants)
            built = time.monotonic() - t0
            took = min(time_restart(directory) for _ in range(3))
            row(
                "restart",
                f"to listening, {grants:,} grants in history",
                None,
                seconds=took[0],
                recovery_ms=took[1] * 1000,
                build_s=built,
            )
            shutil.rmtree(directory)
        empty = ServerProcess(tmp / "empty").start()
        assert empty.proc is not None
        empty_kib = rss_kib(empty.proc.pid)
        empty.kill()
        build_transactional_ids(tmp / "txn", args.transactional_ids)
        held = ServerProcess(tmp / "txn").start(timeout=600)
        assert held.proc is not None
        held_kib = rss_kib(held.proc.pid)
        held.kill()
        per_id = (held_kib - empty_kib) * 1024 / args.transactional_ids
        row(
            "memory",
            f"RSS with {args.transactional_ids:,} transactional ids",
            None,
            rss_mib=held_kib / 1024,
            empty_rss_mib=empty_kib / 1024,
            bytes_per_id=per_id,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    chart(rows, args.out / "results.png")
    print(f"results: {args.out / 'results.json'}, chart: {args.out / 'results.png'}")


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [r for r in rows if r["per_second"] is not None]
    colours = {
        "ceiling": "#999999",
        "disk": "#bbbbbb",
        "zookeeper": "#d9822b",
        "idempotent": "#2b6cb0",
        "transactional": "#2f855a",
        "grants": "#6b46c1",
    }
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rated) + 1.5))
    names = [f"{r['group']}: {r['name']}" for r in rated]
    ax.barh(
        names,
        [r["per_second"] for r in rated],
        color=[colours.get(r["group"], "#444444") for r in rated],
    )
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("operations per second (log scale); grey and orange: baselines of the same run")
    ax.set_title("pidctl against its baselines")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
