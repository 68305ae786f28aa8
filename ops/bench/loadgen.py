"""A small load generator: N connections, each with up to K requests in flight, for T seconds.

Every response is decoded with kio; an error code other than the expected ones, a
correlation id out of order, or a repeated producer id fails the run. It talks only to the
address it is given. Run it in its own process so it does not share a GIL with the server.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from ops.bench.common import first_overlap
from pidctl.protocol import requests
from pidctl.protocol.addresses import HostPort
from pidctl.protocol.client import ClientProtocol

RequestFactory = Callable[[int, int], Any]  # (connection index, request index) -> request


SCENARIOS = ("idempotent", "transactional", "allocate")


def _factory(scenario: str, broker_base: int, epochs: dict[int, int]) -> RequestFactory:
    if scenario == "idempotent":
        return lambda c, i: requests.init_producer_id(None)
    if scenario == "transactional":
        # Each connection re-initialises its own transactional id (durable every time).
        return lambda c, i: requests.init_producer_id(f"bench-{c}")
    # allocate: each connection is one broker, registered first by _register.
    return lambda c, i: requests.allocate(broker_base + c, epochs[c])


def _freeze_what_is_set_up() -> None:
    """Leave everything allocated so far (modules, kio's classes, trio) out of the cyclic
    collector's full collections: each one walked all of it, a 25-60 ms pause of the load
    generator in the middle of a 3 s load, which every request in flight was charged with
    (the round's p99.9, for pidctl and the ceiling alike)."""
    gc.collect()
    gc.freeze()


async def _register(host: str, port: int, broker_id: int) -> int:
    """For the allocate scenario: register a broker; return its epoch."""
    import uuid

    stream = await trio.open_tcp_stream(host, port)
    protocol = ClientProtocol("loadgen-setup")
    async with stream:
        _, data = protocol.send(requests.metadata([]))
        await stream.send_all(data)
        cluster = (await _one(stream, protocol)).cluster_id
        _, data = protocol.send(requests.registration(broker_id, cluster, uuid.uuid4()))
        await stream.send_all(data)
        response = await _one(stream, protocol)
        if response.error_code:
            raise RuntimeError(f"registration refused: {response.error_code!r}")
        return int(response.broker_epoch)


async def _one(stream: trio.SocketStream, protocol: ClientProtocol) -> Any:
    while True:
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        got = protocol.receive(data)
        if got:
            return got[0][1]


async def _connection(
    host: str,
    port: int,
    index: int,
    make: RequestFactory,
    in_flight: int,
    deadline: float,
    latencies: list[float],
    pids: set[tuple[int, int]] | None,
    max_requests: int,
) -> None:
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
                    if hasattr(response, "producer_id_start"):
                        # Blocks: remembered as (start, -length), checked for overlap at the end.
                        key = (response.producer_id_start, -response.producer_id_len)
                    else:
                        key = (response.producer_id, response.producer_epoch)
                    if key in pids:
                        raise RuntimeError(f"producer id and epoch handed out twice: {key}")
                    pids.add(key)
                if time.perf_counter() < deadline and len(latencies) < max_requests:
                    await send_one()


async def run(
    bootstrap: str,
    scenario: str,
    connections: int,
    in_flight: int,
    seconds: float,
    check_unique: bool = True,
    broker_base: int = 10_000,
    max_requests: int = 10_000_000,
    register: bool = True,
) -> dict[str, float]:
    """Load for ``seconds`` (and at most ``max_requests``); raise on any unexpected answer.

    ``register=False``: the allocate scenario sends its requests without registering the
    brokers first (for the framing ceiling, which answers any AllocateProducerIds)."""
    address = HostPort.parse(bootstrap)
    host, port = address.host, address.port
    epochs: dict[int, int] = {}
    make = _factory(scenario, broker_base, epochs)
    latencies: list[float] = []
    pids: set[tuple[int, int]] | None = set() if check_unique else None
    if scenario == "allocate":
        for index in range(connections):
            epochs[index] = 0
    if scenario == "allocate" and register:
        for index in range(connections):
            epochs[index] = await _register(host, port, broker_base + index)
    _freeze_what_is_set_up()
    started = time.perf_counter()
    deadline = started + seconds
    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(
                _connection,
                host,
                port,
                index,
                make,
                in_flight,
                deadline,
                latencies,
                pids,
                max_requests,
            )
    elapsed = time.perf_counter() - started
    if scenario == "allocate" and pids:
        overlap = first_overlap((start, -negative) for start, negative in pids)
        if overlap is not None:
            raise RuntimeError(f"blocks at {overlap[0]} and {overlap[1]} overlap")
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "per_second": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": latencies[-1] * 1000,
        "over_100ms": len(latencies) - bisect.bisect_right(latencies, 0.1),
        "mean_ms": statistics.fmean(latencies) * 1000,
    }


async def storm(
    bootstrap: str, producers: int, spread_s: float, deadline_s: float, check_unique: bool = True
) -> dict[str, Any]:
    """``producers`` idempotent producers connect within ``spread_s`` seconds, each on its own
    connection: an ApiVersions request, then an InitProducerId, retried 50 ms later on
    COORDINATOR_LOAD_IN_PROGRESS (the only error allowed), as clients do. Reports when the
    last one was served, and ``curve``: (seconds, fraction served) at every 5 %."""
    address = HostPort.parse(bootstrap)
    host, port = address.host, address.port
    served: list[float] = []
    retries = 0
    pids: set[int] = set()
    _freeze_what_is_set_up()
    started = time.perf_counter()

    async def producer(index: int) -> None:
        nonlocal retries
        await trio.sleep(spread_s * index / producers)
        stream = await trio.open_tcp_stream(host, port)
        protocol = ClientProtocol(f"storm-{index}")
        async with stream:
            _, data = protocol.send(requests.api_versions())
            await stream.send_all(data)
            versions = await _one(stream, protocol)
            if versions.error_code != 0:
                raise RuntimeError(f"ApiVersions refused: {versions.error_code!r}")
            while True:
                _, data = protocol.send(requests.init_producer_id(None))
                await stream.send_all(data)
                response = await _one(stream, protocol)
                if response.error_code == 0:
                    if check_unique and response.producer_id in pids:
                        raise RuntimeError(f"producer id {response.producer_id} handed out twice")
                    pids.add(response.producer_id)
                    served.append(time.perf_counter() - started)
                    return
                if response.error_code != 14:
                    raise RuntimeError(f"unexpected error {response.error_code!r}")
                retries += 1
                await trio.sleep(0.05)

    with trio.fail_after(deadline_s):
        async with trio.open_nursery() as nursery:
            for index in range(producers):
                nursery.start_soon(producer, index)
    served.sort()
    return {
        "producers": producers,
        "served": len(served),
        "last_served_s": served[-1],
        "p50_s": served[len(served) // 2],
        "p99_s": served[int(0.99 * (len(served) - 1))],
        "retries_14": retries,
        "curve": [
            (served[min(len(served) - 1, round(f * len(served)))], f)
            for f in (i / 20 for i in range(21))
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bootstrap")
    parser.add_argument("--scenario", choices=SCENARIOS, default="idempotent")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--no-unique-check", action="store_true", help="for the fixed-response ceiling server"
    )
    parser.add_argument(
        "--broker-base",
        type=int,
        default=10_000,
        help="allocate scenario: first broker id (each run needs its own)",
    )
    parser.add_argument(
        "--storm",
        type=int,
        metavar="PRODUCERS",
        help="instead: PRODUCERS producers connect within --storm-spread seconds",
    )
    parser.add_argument("--storm-spread", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument(
        "--no-register",
        action="store_true",
        help="allocate scenario: do not register the brokers first (for the ceiling)",
    )
    args = parser.parse_args()
    if args.storm:
        result = trio.run(
            storm, args.bootstrap, args.storm, args.storm_spread, 120.0, not args.no_unique_check
        )
        json.dump(result, sys.stdout)
        return
    result = trio.run(
        run,
        args.bootstrap,
        args.scenario,
        args.connections,
        args.in_flight,
        args.seconds,
        not args.no_unique_check,
        args.broker_base,
        10_000_000,
        not args.no_register,
    )
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
