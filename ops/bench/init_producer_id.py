"""InitProducerId throughput and latency against the framing ceiling, in one run.

    python -m ops.bench.init_producer_id [--seconds 5] [--connections 16]

The ceiling is ops/bench/ceiling.py: the same port type answering every frame with a fixed
pre-encoded response. The load generator is the compiled one (ops/bench/cloadgen.py), in its
own process.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ops.bench.common import ceiling_server, run_json
from ops.testing.serverproc import ServerProcess


def load(
    bootstrap: str, scenario: str, connections: int, seconds: float, *extra: str
) -> dict[str, Any]:
    return run_json(
        "ops.bench.cloadgen",
        bootstrap,
        "--scenario",
        scenario,
        "--connections",
        str(connections),
        "--seconds",
        str(seconds),
        *extra,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    rows: list[tuple[str, dict[str, Any]]] = []

    with ceiling_server() as ceiling:
        baseline = load(ceiling, "idempotent", args.connections, args.seconds, "--no-unique-check")
        rows.append(("framing ceiling (baseline)", baseline))

    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "d") as server:
        for scenario in ("idempotent", "transactional"):
            result = load(server.bootstrap, scenario, args.connections, args.seconds)
            rows.append((f"pidctl {scenario}", result))

    base = rows[0][1]["per_second"]
    print(
        f"InitProducerId, {args.connections} connections, 1 request in flight each, "
        f"{args.seconds:g} s per row"
    )
    print(f"{'':<28} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9}  vs ceiling")
    for name, r in rows:
        print(
            f"{name:<28} {r['per_second']:>9,.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['p999_ms']:>9.2f}  {r['per_second'] / base:.2f}x"
        )


if __name__ == "__main__":
    main()
