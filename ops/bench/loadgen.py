"""A small load generator: N connections, each with up to K requests in flight, for T seconds.

Every response is decoded with kio; an error code other than the expected ones, a
correlation id out of order, or a repeated producer id fails the run. It talks only to the
address it is given. Run it in its own process so it does not share a GIL with the server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from protocol import requests
from protocol.client import ClientProtocol

RequestFactory = Callable[[int, int], Any]  # (connection index, request index) -> request


def _factories() -> dict[str, RequestFactory]:
    return {
        "idempotent": lambda c, i: requests.init_producer_id(None),
        "transactional": lambda c, i: requests.init_producer_id(f"bench-{c}-{i % 64}"),
    }


async def _connection(
    host: str, port: int, index: int, make: RequestFactory, in_flight: int, deadline: float,
    latencies: list[float], pids: set[tuple[int, int]] | None,
) -> None:  # fmt: skip
    stream = await trio.open_tcp_stream(host, port)
    protocol = ClientProtocol(f"loadgen-{index}")
    sent_at: dict[int, float] = {}
    count = 0
    async with stream:

        async def send_one() -> None:
            nonlocal count
            correlation_id, data = protocol.send(make(index, count))
            count += 1
            sent_at[correlation_id] = time.perf_counter()
            await stream.send_all(data)

        for _ in range(in_flight):
            await send_one()
        while protocol.outstanding:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            now = time.perf_counter()
            for correlation_id, response in protocol.receive(data):
                latencies.append(now - sent_at.pop(correlation_id))
                if response.error_code != 0:
                    raise RuntimeError(f"unexpected error {response.error_code!r}")
                if pids is not None:
                    key = (response.producer_id, response.producer_epoch)
                    if key in pids:
                        raise RuntimeError(f"producer id and epoch handed out twice: {key}")
                    pids.add(key)
                if time.perf_counter() < deadline:
                    await send_one()


async def run(
    bootstrap: str,
    scenario: str,
    connections: int,
    in_flight: int,
    seconds: float,
    check_unique: bool = True,
) -> dict[str, float]:
    host, _, port = bootstrap.rpartition(":")
    make = _factories()[scenario]
    latencies: list[float] = []
    pids: set[tuple[int, int]] | None = set() if check_unique else None
    started = time.perf_counter()
    deadline = started + seconds
    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(
                _connection, host, int(port), index, make, in_flight, deadline, latencies, pids
            )
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "per_second": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "mean_ms": statistics.fmean(latencies) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bootstrap")
    parser.add_argument("--scenario", choices=sorted(_factories()), default="idempotent")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--no-unique-check", action="store_true", help="for the fixed-response ceiling server"
    )
    args = parser.parse_args()
    result = trio.run(run, args.bootstrap, args.scenario, args.connections, args.in_flight,
                      args.seconds, not args.no_unique_check)  # fmt: skip
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
