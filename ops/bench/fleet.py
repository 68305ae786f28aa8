"""Benchmark of a fleet sharing one PID space through etcd leases (issue: etcd fleet).

    python -m ops.bench.fleet [--seconds 5] [--brokers 16] [--build compiled|interpreted]

Durable AllocateProducerIds per second with BROKERS brokers (one request in flight each,
the load generator in processes of its own):
- baseline: one controller on its own (no pid_source);
- one controller leasing from etcd;
- three controllers leasing from the same etcd, the brokers spread over them.
Each load reports the cores its controllers and its load generators used (a controller's
durable grants wait for its syncs, so its share stays below a core, as the durable rows').
It also reports etcd transactions (and reads) per million PIDs granted, and checks that the
grants in the three controllers' logs never overlap. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

from ops.bench.common import add_build_argument, first_overlap, run_json, use_build
from ops.testing.coordination import EtcdProcess
from ops.testing.serverproc import ServerProcess
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.recovery import read_log

PIDS_PER_BLOCK = 1000


def _etcd_requests(server: ServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pattern = r'^pidctl_etcd_request_duration_seconds_count\{operation="(\w+)"\} (\S+)$'
    return {op: float(n) for op, n in re.findall(pattern, text, re.MULTILINE)}


def _controller(data_dir: Path, *args: str) -> ServerProcess:
    """A measured controller: its log read to the end unparsed once it listens (parsing every
    audit line in this process would take a share of the two cores it is measured on)."""
    return ServerProcess(data_dir, *args, events_after_start=False)


def _load(servers: list[ServerProcess], brokers: int, seconds: float) -> dict[str, float]:
    """``brokers`` allocating brokers spread over ``servers``, all at once."""
    shares = [brokers // len(servers) + (i < brokers % len(servers)) for i in range(len(servers))]
    results: list[dict[str, Any]] = [{} for _ in servers]
    pids = [server.proc.pid for server in servers if server.proc is not None]
    assert len(pids) == len(servers), "every controller started"

    def one(index: int) -> None:
        results[index] = run_json(
            "ops.bench.cloadgen",
            servers[index].bootstrap,
            "--scenario",
            "allocate",
            "--connections",
            str(shares[index]),
            "--seconds",
            str(seconds),
            "--broker-base",
            str(10_000 * (index + 1)),
            "--pid",
            str(pids[index]),
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(servers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = sum(r["requests"] for r in results)
    return {
        "grants": requests,
        "grants_per_second": sum(r["per_second"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        # Whether the controllers or their clients were the limit: cores used, summed.
        "controllers_cores": sum(r["servers"][0]["cpu_share"] for r in results),
        "loadgen_cores": sum(r["client_cpu_share"] for r in results),
    }


def _check_disjoint(data_dirs: list[Path]) -> int:
    blocks = [
        (e.record.first_producer_id, e.record.next_producer_id - e.record.first_producer_id)
        for d in data_dirs
        for e in read_log(d).entries()
        if isinstance(e.record, ProducerIdsGranted)
    ]
    overlap = first_overlap(blocks)
    if overlap is not None:
        raise RuntimeError(f"grants overlap at {overlap[1]}")
    return len(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--brokers", type=int, default=16)
    add_build_argument(parser)
    args = parser.parse_args()
    out: dict[str, Any] = {
        "brokers": args.brokers,
        "seconds": args.seconds,
        "build": use_build(args.build),
    }
    with tempfile.TemporaryDirectory() as tmp_name, EtcdProcess(Path(tmp_name) / "etcd") as etcd:
        tmp = Path(tmp_name)
        with _controller(tmp / "alone") as alone:
            out["single_local"] = _load([alone], args.brokers, args.seconds)
        with _controller(tmp / "one", "--pid-source", etcd.pid_source("one")) as one:
            out["single_etcd"] = _load([one], args.brokers, args.seconds)
        source = etcd.pid_source("fleet")
        fleet = [
            _controller(tmp / f"fleet{n}", "--pid-source", source, "--node-id", str(n))
            for n in (1, 2, 3)
        ]
        try:
            for server in fleet:
                server.start()
            result = _load(fleet, args.brokers, args.seconds)
            calls = [_etcd_requests(s) for s in fleet]
        finally:
            for server in fleet:
                server.kill()
        pids = _check_disjoint([s.data_dir for s in fleet]) * PIDS_PER_BLOCK
        txns = sum(c.get("txn", 0) for c in calls)
        reads = sum(c.get("range", 0) for c in calls)
        result["etcd_transactions_per_million_pids"] = txns / (pids / 1e6)
        result["etcd_reads_per_million_pids"] = reads / (pids / 1e6)
        result["etcd_transactions"] = txns
        result["pids_granted"] = pids
        out["fleet_of_3"] = result
    base = out["single_local"]["grants_per_second"]
    out["fleet_vs_single"] = out["fleet_of_3"]["grants_per_second"] / base
    out["single_etcd_vs_single"] = out["single_etcd"]["grants_per_second"] / base
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
