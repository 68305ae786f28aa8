"""Every benchmark scenario with its baselines, in one run: a table, a JSON file and charts.

    python -m ops.bench.suite [--seconds 3] [--rounds 1] [--only ROW[,ROW]] [--hog]
                              [--build compiled|interpreted] [--out ops/bench/results]

Each row is a ratio to a baseline measured in the same run, on the same machine. pidctl
runs compiled, as the image ships it (``ops/compiled.py``, built on first use), unless
``--build interpreted``; the ceiling runs with the same ``PYTHONPATH`` (it shares pidctl's
framing). The rows of
issue 17 (the request path), each runnable alone with ``--only``:

- ``idempotent-16x1``, ``idempotent-16x8``: InitProducerId without a transactional id, 16
  connections with 1 (8) requests in flight, against the framing ceiling answering
  InitProducerId;
- ``allocate-durable-16x1``: durable AllocateProducerIds from 16 brokers, against the ceiling
  answering AllocateProducerIds (and its p50/p99);
- ``transactional-16x1``: 16 connections each re-initialising its own transactional id
  (durable each time), against the ceiling's InitProducerId;
- ``storm``: 10,000 producers, each on its own connection, ApiVersions then InitProducerId,
  all started within 1 s: the time until the last is served, against the ceiling (a minimal
  trio server) with the same client;
- ``memory-per-transactional-id``: RSS per transactional id with 100,000 ids, against the
  same server's RSS without any (read once the snapshot due at its start is written; also
  just after start-up, and its peak);

The throughput rows are measured at 1, 4 and 16 connections, for a latency-vs-throughput
chart per scenario (``<row>.png``; the storm's chart is the fraction served over time).

Further rows: ``disk``, ``zookeeper``, ``grants``, ``fleet``, ``spark``, ``spark-kafka``,
``restart``.
Baselines of those:
- framing ceiling: ops/bench/ceiling.py answers every frame with a fixed pre-encoded response;
- disk: grant-sized appends with an fdatasync each, and one per group of 8 and of 64;
- the seed's design: blocks allocated by a conditional setData on ZooKeeper's
  /latest_producer_id_block (Debian's zookeeper, started here on loopback with a temporary
  data dir; python client kazoo), from 1, 4 and 16 concurrent allocators.
- a fleet (ops/bench/fleet.py): three controllers leasing from one etcd, and one leasing
  controller, against one controller alone;
- Spark (ops/bench/spark.py): preallocation against one InitProducerId per partition, the
  atomic exactly-once sink against a plain batched append (SQLite, PostgreSQL), and its
  streaming writer against foreachBatch with that append;
- Spark to Kafka (ops/bench/spark_kafka.py): pidctl-kafka against Spark's own Kafka sink, the
  same job into the same broker.
The load generator is compiled (ops/bench/loadgen.c, built on first use by ops/bench/cloadgen.py):
one process, one epoll loop, checking every answer's correlation id and error code (and, for
pidctl, that no PID or block is handed out twice). It measures the CPU time of the server it
loads over the measured window, and its own. A throughput row whose baseline used less than
SATURATED_CORE_SHARE of a core was held back by something else than the baseline's own work
(the load generator, the machine): it is printed as client-bound and its ratio is not
counted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from ops.bench import cloadgen
from ops.bench.common import (
    ROOT,
    add_build_argument,
    ceiling_process,
    exit_on_sigterm,
    median_by,
    rss_kib,
    run_json,
    use_build,
)
from ops.bench.core import append_history, build_history, disk_rate, time_restart
from ops.bench.stalls import stall_probe
from ops.testing.coordination import ZOOKEEPER, ZooKeeperProcess
from ops.testing.serverproc import ServerProcess, wait_until

#: The storm opens --storm connections from one address (the defaults would refuse most);
#: within a 20,000 file-descriptor limit.
STORM_LIMITS = ("--max-connections", "15000", "--max-connections-per-address", "15000")
#: Connections of the points of each latency-vs-throughput curve; the row's figure is the last.
CURVE_CONNECTIONS = (1, 4, 16)
#: Colours of the charts: pidctl, and the baseline of the same run.
PIDCTL_COLOUR, BASELINE_COLOUR = "#2b6cb0", "#999999"
#: What ``--short`` sets.
#: (20,000 transactional ids: some 3 MB in pidctl, where two servers' RSS differ by a few
#: hundred KB of their own; with 2,000 the short memory rows once read -20 B per id.)
SHORT: dict[str, Any] = {"seconds": 0.3, "storm": 200, "transactional_ids": 20_000}


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

    from pidctl.controller.api.quorum import Now, QuorumController
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
        quorum: QuorumController
        metalog = MetadataLog(
            data_dir, 0, 0, lambda: quorum.snapshot(), snapshot_interval_records=10**9
        )
        quorum = QuorumController(state, metalog)
        now = Now(int(time.time() * 1000), 0)
        async with trio.open_nursery() as nursery:
            await nursery.start(metalog.run)
            append_history(quorum, [ClusterCreated("bench", 1)], now)
            append_history(quorum, [ProducerIdsGranted(1, -1, 0, count, holder="controller")], now)
            for i in range(count):
                record = TransactionalIdUpdated(f"app-{i:08d}", i, 0, i, -1, 60_000, now.wall_ms)
                append_history(quorum, [record], now)
                if i % 20_000 == 19_999:
                    await metalog.flush()
            await metalog.flush()
            nursery.cancel_scope.cancel()

    trio.run(main)


@dataclass
class Run:
    """One suite run: options, a scratch directory, the rows measured so far."""

    args: argparse.Namespace
    tmp: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    _brokers: int = 0
    #: What rows share (say a Kafka node, ops/bench/kafka.py), closed when the run ends.
    resources: ExitStack = field(default_factory=ExitStack)
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def secs(self) -> str:
        return str(self.args.seconds)

    def row(self, group: str, name: str, per_second: float | None, **extra: Any) -> None:
        """Record and print one row."""
        self.rows.append({"group": group, "name": name, "per_second": per_second, **extra})
        shown = f"{per_second:>10,.0f}/s" if per_second is not None else " " * 12
        details = "  ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in extra.items()
            if not isinstance(v, list | dict)
        )
        print(f"{group:<14} {name:<44} {shown}  {details}", flush=True)

    def broker_base(self) -> int:
        """Broker ids no earlier load of this run registered."""
        self._brokers += 1
        return 10_000 * self._brokers

    @cached_property
    def disk(self) -> dict[int, float]:
        return {g: disk_rate(self.tmp, g, self.args.seconds) for g in (1, 8, 64)}

    @cached_property
    def zookeeper(self) -> dict[int, float]:
        if not ZOOKEEPER.exists():
            return {}
        with ZooKeeperProcess(self.tmp / "zk") as zk:
            return {
                n: zookeeper_allocations_per_second(zk.hosts, n, self.args.seconds)
                for n in (1, 4, 16)
            }


#: A baseline that used less of one core than this while it was measured was not the limit
#: of its own rate: the load generator (or the busy machine) was. Such a round's ratio says
#: nothing of pidctl, so it is reported as client-bound and not counted.
SATURATED_CORE_SHARE = 0.9

#: What a throughput row reports beside its rate (from :func:`probed_load`).
_LATENCY_KEYS = (
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "stalled_ms_per_s",
    "longest_stall_ms",
    "server_cpu_us_per_request",
    "server_cpu_share",
    "loadgen_cpu_share",
    "others_cores",
)


def _latencies(r: dict[str, Any]) -> dict[str, Any]:
    return {key: r[key] for key in _LATENCY_KEYS}


#: The stall probe's own window, right after each measured one, with the same load (no
#: longer than the measured one: ``--short``).
PROBE_SECONDS = 1.0


def probed_load(
    bootstrap: str,
    server_pid: int,
    load: cloadgen.Load,
    measured: Callable[[], object] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The compiled load generator (:func:`cloadgen.run`), then the same load for
    :data:`PROBE_SECONDS` more with the stall probe running beside it
    (``ops/bench/stalls.py``): the machine's stops, which hold every request in flight, are
    reported with the latencies. The latencies and the rate are the first window's: the
    probe, a process waking a thousand times a second on the same two cores, raised the
    durable row's p99 by 0.3-0.4 ms beside it (alternated rounds, docs/design-decisions.md).
    Also the server's CPU time over the measured window, per request (its efficiency,
    steadier than a rate on a machine whose speed varies from hour to hour) and as a share
    of one core (whether it was the limit), with the load generator's own share and the
    other work on the machine meanwhile (``others_cores``). ``measured`` is called between
    the two windows (a caller's own counters of the measured one)."""
    result = cloadgen.run(bootstrap, load, pids=[server_pid], **options)
    if measured is not None:
        measured()
    with stall_probe() as stalls:
        seconds = min(PROBE_SECONDS, options.get("seconds", PROBE_SECONDS))
        cloadgen.run(bootstrap, load, pids=[server_pid], **{**options, "seconds": seconds})
    result.update(stalls.summary())
    server = result["servers"][0]
    result["server_cpu_us_per_request"] = server["cpu_s"] * 1e6 / max(1, result["requests"])
    result["server_cpu_share"] = server["cpu_share"]
    result["loadgen_cpu_share"] = result["client_cpu_share"]
    # The machine's other work meanwhile (other processes; in cores): what holds a baseline
    # below a core when its load generator does not.
    others = result["machine_busy_cores"] - server["cpu_share"] - result["client_cpu_share"]
    result["others_cores"] = round(max(0.0, others), 2)
    return result


def saturated(baseline: dict[str, Any]) -> bool:
    """Whether a baseline's measurement kept it busy (see :data:`SATURATED_CORE_SHARE`)."""
    return bool(baseline["server_cpu_share"] >= SATURATED_CORE_SHARE)


def _storm_times(r: dict[str, Any]) -> dict[str, Any]:
    return {"last_served_s": r["last_served_s"], "p50_s": r["p50_s"], "p99_s": r["p99_s"]}


def _curves(
    run: Run,
    key: str,
    title: str,
    scenario: str,
    in_flight: int,
    ceiling_scenario: str,
) -> None:
    """A throughput row: pidctl and the ceiling at each of CURVE_CONNECTIONS, alternately
    (so that a busy spell of the machine falls on both), a chart, and the last point's ratio:
    with ``--rounds N`` that point is measured N times, alternately, and the round with the
    median ratio among those whose ceiling was saturated is the row's figure. With none, the
    row is client-bound: printed, not counted."""
    points: dict[str, list[dict[str, Any]]] = {"pidctl": [], "ceiling": []}
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with (
        ceiling_process() as (ceiling, ceiling_pid),
        ServerProcess(run.tmp / key, events_after_start=False) as server,
    ):
        assert server.proc is not None
        server_pid = server.proc.pid
        base_load = cloadgen.scenario_load(ceiling, ceiling_scenario, register=False).unchecked()

        def measure(conns: int) -> tuple[dict[str, Any], dict[str, Any]]:
            options = {"connections": conns, "in_flight": in_flight, "seconds": run.args.seconds}
            base = probed_load(ceiling, ceiling_pid, base_load, **options)
            load = cloadgen.scenario_load(server.bootstrap, scenario, broker_base=run.broker_base())
            mine = probed_load(server.bootstrap, server_pid, load, **options)
            return base, mine

        for conns in run.args.points:
            base, mine = measure(conns)
            points["ceiling"].append({"connections": conns, **base})
            points["pidctl"].append({"connections": conns, **mine})
        rounds.append((base, mine))
        rounds += [measure(conns) for _ in range(run.args.rounds - 1)]

    def ratio(r: tuple[dict[str, Any], dict[str, Any]]) -> float:
        return float(r[1]["per_second"] / r[0]["per_second"])

    counted = [r for r in rounds if saturated(r[0])]
    base, mine = (
        median_by(counted, ratio)
        if counted
        else max(rounds, key=lambda r: r[0]["server_cpu_share"])
    )
    shown = " ".join(f"{ratio(r):.2f}{'' if saturated(r[0]) else '(client-bound)'}" for r in rounds)
    run.row(
        "ceiling",
        f"fixed {ceiling_scenario} answer, {conns} conn x {in_flight}",
        base["per_second"],
        **_latencies(base),
    )
    verdict: dict[str, Any] = {
        "ratio": ratio((base, mine)) if counted else None,
        "client_bound": not counted,
    }
    if not counted:
        verdict["why"] = (
            f"client-bound: the ceiling used at most {base['server_cpu_share']:.2f} of a core"
            f" (< {SATURATED_CORE_SHARE}), other work on the machine"
            f" {base['others_cores']:.2f} cores; not counted"
        )
    run.row(
        key,
        title,
        mine["per_second"],
        **_latencies(mine),
        cpu_per_request_ratio=mine["server_cpu_us_per_request"] / base["server_cpu_us_per_request"],
        **verdict,
        baseline="framing ceiling",
        rounds=shown,
        rounds_counted=len(counted),
        curve=points,
    )
    curve_chart(title, points, run.args.out / f"{key}.png")


def row_idempotent_16x1(run: Run) -> None:
    _curves(run, "idempotent-16x1", "InitProducerId, 16 conn x 1", "idempotent", 1, "idempotent")


def row_idempotent_16x8(run: Run) -> None:
    _curves(run, "idempotent-16x8", "InitProducerId, 16 conn x 8", "idempotent", 8, "idempotent")


def row_allocate_durable(run: Run) -> None:
    _curves(
        run,
        "allocate-durable-16x1",
        "durable AllocateProducerIds, 16 brokers x 1",
        "allocate",
        1,
        "allocate",
    )


def row_transactional(run: Run) -> None:
    _curves(
        run,
        "transactional-16x1",
        "InitProducerId, own transactional id, 16 conn x 1",
        "transactional",
        1,
        "idempotent",
    )


def row_storm(run: Run) -> None:
    """The start-up storm against the ceiling with the same client; ratio = time until the
    last producer is served, pidctl's over the ceiling's (lower is better). With
    ``--rounds N``, N pairs, in turn which goes first (one pair moved by a third from one run
    to the next, as the machine's speed drifted between its two halves), and the pair with
    the median ratio is the row's figure."""
    producers = run.args.storm
    load = cloadgen.storm_load()
    options: dict[str, Any] = {"connections": producers, "storm": True, "spread": 1.0}

    def ceiling() -> dict[str, Any]:
        with ceiling_process() as (bootstrap, pid):
            return cloadgen.run(bootstrap, load.unchecked(), pids=[pid], **options)

    def pidctl(index: int) -> dict[str, Any]:
        data_dir = run.tmp / f"storm-{index}"
        with ServerProcess(data_dir, *STORM_LIMITS, events_after_start=False) as server:
            assert server.proc is not None
            return cloadgen.run(server.bootstrap, load, pids=[server.proc.pid], **options)

    def ratio(pair: tuple[dict[str, Any], dict[str, Any]]) -> float:
        return float(pair[1]["last_served_s"] / pair[0]["last_served_s"])

    pairs = []
    for index in range(run.args.rounds):
        if index % 2 == 0:
            base = ceiling()
            pairs.append((base, pidctl(index)))
        else:
            mine = pidctl(index)
            pairs.append((ceiling(), mine))
    base, mine = median_by(pairs, ratio)
    base_cpu, mine_cpu = base["servers"][0]["cpu_s"], mine["servers"][0]["cpu_s"]
    run.row(
        "ceiling",
        f"storm: {producers:,} producers, minimal server",
        None,
        **_storm_times(base),
        server_cpu_s=base_cpu,
        loadgen_cpu_s=base["client_cpu_s"],
    )
    run.row(
        "storm",
        f"{producers:,} producers connect within 1 s",
        None,
        served=mine["served"],
        **_storm_times(mine),
        retries_14=mine["retries"],
        reconnects=mine["reconnects"],
        server_cpu_s=mine_cpu,
        loadgen_cpu_s=mine["client_cpu_s"],
        cpu_ratio=mine_cpu / max(base_cpu, 0.01),
        ratio=ratio((base, mine)),
        rounds=" ".join(f"{ratio(pair):.2f}" for pair in pairs),
        baseline="minimal trio server, same client (time ratio: lower is better)",
        curve={"pidctl": mine["curve"], "ceiling": base["curve"]},
    )
    storm_chart(producers, mine["curve"], base["curve"], run.args.out / "storm.png")


class HeldMemory(NamedTuple):
    """pidctl's RSS in KiB on an empty data dir, and on one holding transactional ids."""

    empty_kib: int
    #: Holding the ids, once its start-up work is done (the snapshot of them all it writes
    #: in a thread just after start-up, when the log holds more records than the interval).
    held_kib: int
    #: Holding the ids, just after start-up: the snapshot's buffers may be in it.
    at_start_kib: int
    #: The most it had (``VmHWM``): recovery's and the snapshot's buffers at their largest.
    peak_kib: int


def rss_with_transactional_ids(directory: Path, count: int) -> HeldMemory:
    """pidctl's RSS just after start-up on an empty data dir, and on one holding ``count``
    transactional ids (both under ``directory``)."""
    from pidctl.controller.log.snapshots import DEFAULT_SNAPSHOT_INTERVAL_RECORDS

    empty = ServerProcess(directory / "empty").start()
    assert empty.proc is not None
    empty_kib = rss_kib(empty.proc.pid)
    empty.kill()
    build_transactional_ids(directory / "txn", count)
    held = ServerProcess(directory / "txn").start(timeout=600)
    assert held.proc is not None
    at_start_kib = rss_kib(held.proc.pid)
    if count >= DEFAULT_SNAPSHOT_INTERVAL_RECORDS:  # (the data dir has no snapshot)
        wait_until(
            lambda: any(e.get("event") == "snapshot written" for e in held.events),
            "the start-up snapshot",
            timeout=600,
        )
    held_kib = rss_kib(held.proc.pid)
    peak_kib = rss_kib(held.proc.pid, "VmHWM")
    held.kill()
    return HeldMemory(empty_kib, held_kib, at_start_kib, peak_kib)


def row_memory(run: Run) -> None:
    """RSS per transactional id: the server holding ``--transactional-ids`` ids against the
    same server started on an empty data dir (both just after start-up; the one holding
    ids once it has written the snapshot due at its start), and the most it held."""
    count = run.args.transactional_ids
    memory = rss_with_transactional_ids(run.tmp, count)
    empty_kib, held_kib = memory.empty_kib, memory.held_kib
    run.row(
        "memory-per-transactional-id",
        f"RSS with {count:,} transactional ids",
        None,
        rss_mib=held_kib / 1024,
        empty_rss_mib=empty_kib / 1024,
        bytes_per_id=(held_kib - empty_kib) * 1024 / count,
        bytes_per_id_at_start=(memory.at_start_kib - empty_kib) * 1024 / count,
        peak_bytes_per_id=(memory.peak_kib - empty_kib) * 1024 / count,
        ratio=held_kib / empty_kib,
        baseline="the same server's RSS without ids",
    )


def row_disk(run: Run) -> None:
    for g, rate in run.disk.items():
        run.row("disk", f"150 B appends, one fdatasync per {g}", rate)


def row_zookeeper(run: Run) -> None:
    for n, rate in run.zookeeper.items():
        run.row("zookeeper", f"conditional setData, {n} allocators", rate)


def row_grants(run: Run) -> None:
    with ServerProcess(run.tmp / "grants") as server:
        assert server.proc is not None
        for n in (1, 4, 16):
            load = cloadgen.scenario_load(
                server.bootstrap, "allocate", broker_base=run.broker_base()
            )
            r = probed_load(
                server.bootstrap, server.proc.pid, load, connections=n, seconds=run.args.seconds
            )
            extra: dict[str, Any] = {
                **_latencies(r),
                "vs_group_commit_64": r["per_second"] / run.disk[64],
            }
            if n in run.zookeeper:
                extra["vs_zookeeper"] = r["per_second"] / run.zookeeper[n]
            run.row("grants", f"AllocateProducerIds, {n} brokers", r["per_second"], **extra)


def row_fleet(run: Run) -> None:
    fleet = run_json(
        "ops.bench.fleet", "--seconds", run.secs, "--brokers", "16", "--build", run.args.build
    )
    for key, name in (
        ("single_local", "1 controller, no etcd (baseline)"),
        ("single_etcd", "1 controller leasing from etcd"),
        ("fleet_of_3", "3 controllers leasing from one etcd"),
    ):
        r = fleet[key]
        extra = {
            "p99_ms": r["p99_ms"],
            "vs_single": r["grants_per_second"] / fleet["single_local"]["grants_per_second"],
            "controllers_cores": r["controllers_cores"],
            "loadgen_cores": r["loadgen_cores"],
        }
        if key == "fleet_of_3":
            extra["etcd_txns_per_million_pids"] = r["etcd_transactions_per_million_pids"]
        run.row(
            "fleet", f"AllocateProducerIds, 16 brokers: {name}", r["grants_per_second"], **extra
        )


def row_spark(run: Run) -> None:
    spark = run_json("ops.bench.spark")
    driver = spark["driver"]
    run.row(
        "spark",
        "preallocate 1,000 partitions (1 request)",
        None,
        ms=driver["preallocate_1000_s"] * 1000,
        init_producer_id_each_ms=driver["init_producer_id_x1000_s"] * 1000,
    )
    run.row(
        "spark",
        "preallocate 100,000 partitions (100 pipelined)",
        None,
        ms=driver["preallocate_100000_s"] * 1000,
    )
    for backend in ("sqlite", "postgresql"):
        r = spark[backend]
        run.row(
            "spark",
            f"exactly-once sink, {backend}, rows/s",
            r["exactly_once_rows_per_s"],
            vs_plain_append=r["exactly_once_vs_plain"],
        )
        r = spark[f"{backend}_stream"]
        run.row(
            "spark",
            f"exactly-once stream sink, {backend}, rows/s",
            r["exactly_once_rows_per_s"],
            vs_foreach_batch=r["exactly_once_vs_foreach_batch"],
        )


def row_spark_kafka(run: Run) -> None:
    r = run_json("ops.bench.spark_kafka", "--rounds", "3")
    cluster = r["cluster"]
    for sink in ("write_kafka", "pidctl-kafka"):
        median = cluster[f"{sink}_median_round"]
        mine, spark = median[sink], median["kafka"]
        run.row(
            "spark-kafka",
            f"{sink} job seconds, {cluster['rows']:,} rows on a two-worker cluster, against "
            "Spark's own Kafka sink",
            mine["job_s"],
            vs_spark_kafka_sink=cluster[f"median_{sink}_job_ratio"],
            write_vs_spark_kafka_sink=cluster[f"median_{sink}_write_ratio"],
            spark_sink_job_s=spark["job_s"],
            cpu_s=mine["cpu_s"],
            spark_sink_cpu_s=spark["cpu_s"],
        )
    states = r["producer_states"]
    run.row(
        "spark-kafka",
        f"broker producer states after a {states['spark_partitions']:,}-partition job",
        None,
        pidctl_kafka=states["pidctl-kafka"],
        spark_kafka_sink=states["kafka"],
    )


def row_restart(run: Run) -> None:
    for grants in (1_000, run.args.history):
        directory = run.tmp / f"history-{grants}"
        t0 = time.monotonic()
        build_history(directory, grants)
        built = time.monotonic() - t0
        took = min(time_restart(directory) for _ in range(3))
        run.row(
            "restart",
            f"to listening, {grants:,} grants in history",
            None,
            seconds=took[0],
            recovery_ms=took[1] * 1000,
            build_s=built,
        )
        shutil.rmtree(directory)


#: Every row, in the order a full run measures them.
ROWS: dict[str, Callable[[Run], None]] = {
    "idempotent-16x1": row_idempotent_16x1,
    "idempotent-16x8": row_idempotent_16x8,
    "allocate-durable-16x1": row_allocate_durable,
    "transactional-16x1": row_transactional,
    "storm": row_storm,
    "memory-per-transactional-id": row_memory,
    "disk": row_disk,
    "zookeeper": row_zookeeper,
    "grants": row_grants,
    "fleet": row_fleet,
    "spark": row_spark,
    "spark-kafka": row_spark_kafka,
    "restart": row_restart,
}
#: The rows of issue 17: each reports ``ratio`` against its baseline of the same run.
RATIO_ROWS = tuple(list(ROWS)[:6])


def all_rows() -> dict[str, Callable[[Run], None]]:
    """:data:`ROWS`, then the rows against Apache Kafka itself (ops/bench/kafka.py, which
    measures with this module's functions)."""
    from ops.bench import kafka

    return {**ROWS, **kafka.ROWS}


def _only(text: str) -> list[str]:
    rows = all_rows()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in rows]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown row {', '.join(unknown) or '(none)'}; rows: {', '.join(rows)}"
        )
    return names


@contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """With ``on``: a process spinning on one core beside the whole run (figures under a CPU
    hog, as the issue asks besides the quiet ones)."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the rows asked for; write ``results.json`` and the charts into ``--out``; return
    the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per load point")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="throughput rows and the storm: measure the row's own point this many times, "
        "alternately with its baseline (median ratio)",
    )
    parser.add_argument(
        "--only",
        type=_only,
        default=list(all_rows()),
        metavar="ROW[,ROW]",
        help=f"rows: {', '.join(all_rows())}",
    )
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--transactional-ids", type=int, default=100_000)
    parser.add_argument("--storm", type=int, default=10_000, metavar="PRODUCERS")
    parser.add_argument(
        "--hog", action="store_true", help="run beside a process spinning on one core"
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"a quick check that every row runs: --seconds {SHORT['seconds']}, one load point"
        f" ({CURVE_CONNECTIONS[-1]} connections), --storm {SHORT['storm']},"
        f" --transactional-ids {SHORT['transactional_ids']} (figures not to be quoted)",
    )
    add_build_argument(parser)
    parser.add_argument("--out", type=Path, default=ROOT / "ops" / "bench" / "results")
    args = parser.parse_args(argv)
    args.points = CURVE_CONNECTIONS
    if args.short:
        vars(args).update(SHORT, points=CURVE_CONNECTIONS[-1:])
    from pidctl.controller.server.telemetry.logs import configure_logging, reset_logging

    # The in-process log builders stay quiet; undone afterwards, and never cached by a
    # module's logger, when the suite runs in a test's process.
    configure_logging("console", "warning", cache=False)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        build = use_build(args.build)
        print(f"pidctl: {build}", flush=True)
        results: dict[str, Any] = {
            "seconds_per_run": args.seconds,
            "hog": args.hog,
            "build": build,
            "rows": [],
        }
        with tempfile.TemporaryDirectory(dir=ROOT) as tmp_name, cpu_hog(args.hog):
            run = Run(args, Path(tmp_name), results["rows"])
            rows = all_rows()
            with run.resources:
                for name in args.only:
                    rows[name](run)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
        chart(run.rows, args.out / "results.png")
    finally:
        reset_logging()
    print(f"results: {args.out / 'results.json'}, charts: {args.out}/*.png")
    return results


def curve_chart(title: str, points: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Latency (p50 solid, p99 dashed) against throughput, pidctl and the ceiling, one point
    per connection count."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for who, colour in (("pidctl", PIDCTL_COLOUR), ("ceiling", BASELINE_COLOUR)):
        got = points[who]
        rates = [p["per_second"] for p in got]
        ax.plot(rates, [p["p50_ms"] for p in got], "o-", color=colour, label=f"{who} p50")
        ax.plot(rates, [p["p99_ms"] for p in got], "o--", color=colour, label=f"{who} p99")
        for p in got:
            ax.annotate(f"{p['connections']}c", (p["per_second"], p["p50_ms"]), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("requests per second")
    ax.set_ylabel("latency, ms (log scale)")
    ax.set_title(f"{title}: latency against throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def storm_chart(
    producers: int, mine: list[list[float]], base: list[list[float]], path: Path
) -> None:
    """The fraction of the storm's producers served over time, pidctl and the minimal server."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for who, curve, colour in (
        ("pidctl", mine, PIDCTL_COLOUR),
        ("minimal server", base, BASELINE_COLOUR),
    ):
        ax.plot([t for t, _ in curve], [f * 100 for _, f in curve], "o-", color=colour, label=who)
    ax.set_xlabel("seconds since the storm began")
    ax.set_ylabel("producers served, %")
    ax.set_title(f"start-up storm: {producers:,} producers (ApiVersions, InitProducerId)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
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
    plt.close(fig)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
