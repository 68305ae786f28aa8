"""Rows against Apache Kafka itself (issue 32): pidctl and a Kafka broker, on the same machine,
loaded by the same compiled generator (``ops/bench/loadgen.c``) in the same run, in turns.
docs/benchmarks.md has the method and the figures; docs/design-decisions.md where the time goes.

    python -m ops.bench.suite --rounds 5 --only kafka-idempotent-16x1,\\
        kafka-transactional-16x1,kafka-transactional-flushed-16x1,kafka-allocate-durable-16x1,\\
        kafka-allocate-durable-nolinger-16x1,kafka-storm,kafka-memory-per-transactional-id,\\
        kafka-syncs

The Kafka is :class:`ops.testing.kafka.KafkaNode`: one KRaft node (broker and controller) on
loopback, everything as Kafka ships it except what a single node needs (replication factor 1
of its internal topics) and, per row, the settings named in the row's ``baseline``. The rows
share one node as shipped (it stays warm, as a broker in service is; each row first loads it
until its JIT has settled); a row with other settings starts its own.

- ``kafka-idempotent-16x1``: InitProducerId without a transactional id, 16 connections x 1
  in flight, against the broker (which hands out PIDs from blocks of 1000 it asks its
  controller for, as pidctl does from its own blocks: nothing is written per PID by either);
- ``kafka-transactional-16x1``: each connection re-initialises its own transactional id (a new
  epoch each time). pidctl answers after its ``fdatasync``; Kafka as shipped appends the new
  epoch to ``__transaction_state`` and answers without any sync (its durability is
  replication, of which a single node has none);
- ``kafka-transactional-flushed-16x1``: the same against Kafka with ``flush.messages=1`` on
  ``__transaction_state`` (the topic's own setting, whose broker-wide default is
  ``log.flush.interval.messages``): ``UnifiedLog.append`` then fsyncs the segment before the
  append returns, so the answer follows the sync, as pidctl's does: the durable comparison;
- ``kafka-allocate-durable-16x1``: AllocateProducerIds against Kafka's KRaft controller
  listener from 16 brokers registered first (BrokerRegistration, each its own broker id,
  incarnation and log directory, with the features the controller finalised), each at the
  epoch its registration answered. Kafka's controller appends a ProducerIdsRecord per grant
  to its Raft log and answers once it is committed; its Raft leader fsyncs each batch before
  committing it (``KafkaRaftClient.flushLeaderLog``), and lingers up to
  ``controller.quorum.append.linger.ms`` (25 ms as shipped) collecting a batch first;
  ``kafka-allocate-durable-nolinger-16x1``: the same with that linger 0;
- ``kafka-storm``: 10,000 producers (``--storm``), each its own connection, ApiVersions then
  InitProducerId, started within 1 s: the time until the last is served, against Kafka as
  shipped (a listen backlog of 50) and with the backlog pidctl's listener gets;
- ``kafka-memory-per-transactional-id``: the broker's live heap (``jcmd GC.class_histogram``,
  after the full collection it forces) with ``--transactional-ids`` ids against before them,
  per id; pidctl's RSS per id the suite's way (the same server without ids);
- ``kafka-syncs``: each durable scenario under ``strace -c``: the fsync/fdatasync/msync calls
  each server makes per request answered (rates under strace mean nothing; the counts do).

Every ratio says how many times better pidctl does: its rate over Kafka's, Kafka's time or
bytes over pidctl's (>= 1.0: pidctl ahead).

**Saturation, for a multi-threaded server.** The suite's rule (a single-threaded baseline
using under 90 % of a core was held back by its client) does not carry over to Kafka: on 2
cores its network, request-handler, Raft and GC threads can use more than one core, and a
request crosses several of them (network thread, request queue, handler, purgatory, network
thread), so it can also be limited by its own hand-offs, linger and fsync while using well
under a core. Neither figure says who set the pace. What does is the load generator: one
thread in a closed loop, which sleeps only when every one of its requests is outstanding.
Its *busy share* is the time it was on a CPU or runnable and waiting for one (its run-queue
delay, ``/proc/self/schedstat``) over the window. A round where it was busy >= 90 % of the
window was paced by the generator: **client-bound**, printed, not counted. Otherwise it spent
over a tenth of the window asleep with everything outstanding, waiting for the server: the
rate is the server's, on this machine as it was. A round in which other work used
:data:`CONTENDED_CORES` or more is *contended*: the row's ratio comes from its quiet rounds,
or, with none, from the contended ones, and the row says *machine-bound*. Beside each
figure: the server's cores (CPU seconds over the window), its threads' run-queue delay (time
the busy machine held them back), its CPU per request, the machine's busy cores, for Kafka
the CPU of its thread groups per request (where a multi-threaded server spends its cycles),
for pidctl its group commits.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Feature
from kio.schema.describe_configs.v4 import DescribeConfigsRequest
from kio.schema.describe_configs.v4.request import DescribeConfigsResource
from kio.schema.incremental_alter_configs.v1 import IncrementalAlterConfigsRequest
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
)
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i16

from ops.bench import cloadgen, suite
from ops.bench.common import median_by
from ops.testing.jars import classpath
from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests

#: Kafka's settings of each variant the rows use, beyond the test bed's single-node ones.
SHIPPED: dict[str, str] = {}
#: Kafka's controller committing each Raft batch at once (as shipped it waits up to 25 ms for
#: more records to share the batch's fsync).
NO_LINGER = {"controller.quorum.append.linger.ms": "0"}
#: The transaction log's own setting that fsyncs every append (its broker-wide default is
#: ``log.flush.interval.messages``, Long.MAX_VALUE as shipped).
FLUSH_EVERY_APPEND = ("flush.messages", "1")
TRANSACTION_LOG = "__transaction_state"
#: Kafka's retriable "not ready" (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE,
#: NOT_COORDINATOR) answers while the transaction log's partitions load.
_NOT_READY = (14, 15, 16)
#: IncrementalAlterConfigs and DescribeConfigs: a topic's resource type, SET and DELETE.
_TOPIC, _SET, _DELETE = 2, 0, 1
#: Kafka's warm-up before a row's rounds: loads of this many seconds until its JIT compiler
#: threads used less than WARMED_COMPILER_SHARE of its CPU in one (at most WARM_UP_MAX_S in
#: all; ``--short``: one load of a round's time). A broker in service has long compiled its
#: request path; a fresh JVM spends a third of its CPU compiling at first. pidctl gets one
#: load of WARM_UP_STEP_S (it takes its first block of PIDs; Python compiles nothing).
WARM_UP_STEP_S = 2.0
WARMED_COMPILER_SHARE = 0.05
WARM_UP_MAX_S = 60.0
#: The memory row's transactional ids are created over this many connections, this many
#: requests pipelined on each at a time.
ID_CONNECTIONS = 16
IDS_PER_PIPELINE = 500
#: The system calls that make data durable (Kafka's FileChannel.force is fsync or fdatasync,
#: its index files' MappedByteBuffer.force msync; pidctl's commit fdatasync).
SYNC_CALLS = ("fsync", "fdatasync", "msync", "sync_file_range")
#: strace counting those calls of every thread.
_STRACE = ("strace", "-f", "-c", "-e", "trace=" + ",".join(SYNC_CALLS))
#: How long strace may take to attach to every thread of a JVM.
STRACE_ATTACH_S = 60.0


def kafka_version() -> str:
    """The version of the Kafka the test bed runs (from its broker jar's name)."""
    for jar in classpath("kafka").split(os.pathsep):
        found = re.search(r"kafka_[\d.]+-([\d.]+)\.jar$", jar)
        if found:
            return found.group(1)
    raise RuntimeError("no kafka_2.13 jar on the test bed's class path")


def shared_node(run: suite.Run) -> KafkaNode:
    """The run's Kafka node as shipped, started on first use and stopped when the run ends:
    the rows share it (it stays warm, as a broker in service is)."""
    if "kafka" not in run.shared:
        run.shared["kafka"] = run.resources.enter_context(KafkaNode(SHIPPED, shipped_jvm=True))
    node: KafkaNode = run.shared["kafka"]
    return node


@contextlib.contextmanager
def kafka_with(run: suite.Run, settings: dict[str, str]) -> Iterator[KafkaNode]:
    """The shared node if ``settings`` are none; else a node of the row's own with them,
    stopped when the row is done."""
    if not settings:
        yield shared_node(run)
        return
    with KafkaNode(settings, shipped_jvm=True) as node:
        yield node


def ready_for_transactions(node: KafkaNode) -> None:
    """Ask for a transaction coordinator until Kafka has created ``__transaction_state`` and
    loaded its partitions, then until it initialises a transactional id (bounded)."""

    def answered(request: Any) -> bool:
        with SyncClient(node.bootstrap) as client:
            answer = client.request(request)
        errors = [c.error_code for c in getattr(answer, "coordinators", ())] or [answer.error_code]
        if any(error.value not in (0, *_NOT_READY) for error in errors):
            raise RuntimeError(f"Kafka answered {answer}")
        return all(error.value == 0 for error in errors)

    wait_until(lambda: answered(requests.find_coordinator("bench-warm-up")), "a coordinator")
    wait_until(lambda: answered(requests.init_producer_id("bench-warm-up")), "a first epoch")


def set_topic_config(node: KafkaNode, topic: str, name: str, value: str | None) -> None:
    """Set (or with ``None`` delete) a topic's setting through IncrementalAlterConfigs, and
    wait until the broker describes it so."""
    change = AlterableConfig(
        name=name, config_operation=i8(_DELETE if value is None else _SET), value=value
    )
    alter = IncrementalAlterConfigsRequest(
        resources=(
            AlterConfigsResource(resource_type=i8(_TOPIC), resource_name=topic, configs=(change,)),
        ),
        validate_only=False,
    )
    describe = DescribeConfigsRequest(
        resources=(
            DescribeConfigsResource(
                resource_type=i8(_TOPIC), resource_name=topic, configuration_keys=(name,)
            ),
        )
    )
    with SyncClient(node.bootstrap) as client:
        answer = client.request(alter)
        if answer.responses[0].error_code.value:
            raise RuntimeError(f"Kafka refused {name}={value} on {topic}: {answer}")

        def described() -> bool:
            result = client.request(describe).results[0]
            entry = next(c for c in result.configs if c.name == name)
            # A deleted override is no longer the topic's own (source 1: DYNAMIC_TOPIC_CONFIG).
            return bool(entry.value == value if value is not None else entry.config_source != 1)

        wait_until(described, f"{topic} described with {name}={value}")


@contextlib.contextmanager
def flushed_transaction_log(node: KafkaNode) -> Iterator[None]:
    """Kafka's transaction log fsynced on every append for the duration."""
    name, value = FLUSH_EVERY_APPEND
    set_topic_config(node, TRANSACTION_LOG, name, value)
    try:
        yield
    finally:
        set_topic_config(node, TRANSACTION_LOG, name, None)


def kafka_registration(node: KafkaNode) -> Callable[[int, uuid.UUID], BrokerRegistrationRequest]:
    """A BrokerRegistration v4 Kafka's controller accepts: its cluster id, every feature it
    finalised (at that level), and one log directory (patched per broker by
    :func:`kafka_allocate`: a directory belongs to one broker)."""
    with SyncClient(node.controller_bootstrap) as client:
        finalized = client.request(requests.api_versions()).finalized_features
    features = tuple(
        Feature(
            name=f.name,
            min_supported_version=i16(f.max_version_level),
            max_supported_version=i16(f.max_version_level),
        )
        for f in finalized
    )
    return lambda broker_id, incarnation: BrokerRegistrationRequest(
        broker_id=BrokerId(broker_id),
        cluster_id=node.cluster_id,
        incarnation_id=incarnation,
        listeners=(),
        features=features,
        rack=None,
        log_dirs=(_LOG_DIR,),
    )


#: The log directory the registrations name: a random run-wide id whose last four bytes
#: :func:`kafka_allocate` makes the connection's own.
_LOG_DIR = uuid.UUID(bytes=uuid.uuid4().bytes[:12] + b"\x5a\x5a\x5a\x04")


def kafka_allocate(node: KafkaNode, broker_base: int) -> cloadgen.Load:
    """AllocateProducerIds from 16 brokers (``broker_base`` + the connection's number), each
    registered first with Kafka's controller."""
    load = cloadgen.allocate(broker_base, kafka_registration(node))
    log_dir_at = cloadgen.offset_of(load.setup[0], _LOG_DIR.bytes)
    load.patches.append(("0", log_dir_at + 12, 4, broker_base, "int"))
    return load


# -- measuring ---------------------------------------------------------------------------------


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process (``/proc/PID/task/TID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            used[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return used


def java_thread_groups(pid: int) -> dict[int, str]:
    """Each JVM thread's group: its name (``jcmd PID Thread.print``) with numbers as N
    ("data-plane-kafka-request-handler-N", "GC Thread#N", "C2 CompilerThreadN")."""
    printed = subprocess.run(
        ["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, timeout=120
    ).stdout
    groups = {}
    for name, nid in re.findall(r'^"([^"]+)".*?\bnid=(0x[0-9a-f]+)', printed, re.M):
        groups[int(nid, 16)] = re.sub(r"\d+", "N", name)
    return groups


def breakdown(
    pid: int, before: dict[int, float], after: dict[int, float], requests_answered: int
) -> dict[str, float]:
    """Microseconds of CPU per request of each thread group, largest first (the groups
    under 2 % of the whole together as "other")."""
    names = java_thread_groups(pid)
    per_group: dict[str, float] = defaultdict(float)
    for tid, seconds in after.items():
        per_group[names.get(tid, "(ended or unnamed)")] += seconds - before.get(tid, 0.0)
    total = sum(per_group.values()) or 1.0
    shown: dict[str, float] = {}
    for group, seconds in sorted(per_group.items(), key=lambda item: -item[1]):
        key = group if seconds >= 0.02 * total else "other"
        shown[key] = shown.get(key, 0.0) + seconds * 1e6 / max(1, requests_answered)
    return shown


#: Other work on the machine using this many cores during a round makes it *contended*: the
#: scheduler shares the cores per thread, so a server of one thread (pidctl) gets less of
#: them than one of dozens (Kafka) and the rates say how the cores were shared more than
#: how fast either server is. Such a round is counted only when no round is quiet.
CONTENDED_CORES = 0.25


#: pidctl's group-commit metrics (Prometheus histograms' sums and counts).
_COMMIT_METRICS = ("pidctl_log_fsync_duration_seconds", "pidctl_log_commit_batch_records")


def commit_totals(metrics_url: str) -> dict[str, float]:
    """The sums and counts of pidctl's group-commit histograms, from its ``/metrics``."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    totals = {}
    for name in _COMMIT_METRICS:
        for part in ("sum", "count"):
            found = re.search(rf"^{name}_{part} (\S+)$", text, re.M)
            totals[f"{name}_{part}"] = float(found.group(1)) if found else 0.0
    return totals


def commit_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """pidctl's group commits between two :func:`commit_totals`: their mean time (a write and
    an fdatasync) and records each (none: {})."""
    fsync, batch = _COMMIT_METRICS
    commits = after[f"{fsync}_count"] - before[f"{fsync}_count"]
    if not commits:
        return {}
    return {
        "commits": commits,
        "commit_ms_mean": (after[f"{fsync}_sum"] - before[f"{fsync}_sum"]) * 1000 / commits,
        "records_per_commit": (after[f"{batch}_sum"] - before[f"{batch}_sum"])
        / max(1.0, after[f"{batch}_count"] - before[f"{batch}_count"]),
    }


def measured(
    bootstrap: str,
    pid: int,
    load: cloadgen.Load,
    seconds: float,
    *,
    threads: bool = False,
    metrics_url: str | None = None,
) -> dict[str, Any]:
    """One round: :func:`suite.probed_load` (16 x 1) and the figures of the saturation rule;
    with ``threads``, the CPU per request of each of the server's thread groups; with
    ``metrics_url`` (pidctl's), its group commits'."""
    before = thread_cpu_s(pid) if threads else {}
    commits = commit_totals(metrics_url) if metrics_url else {}
    after: dict[str, Any] = {}

    def read_counters() -> None:  # (before the probe's window)
        after["threads"] = thread_cpu_s(pid) if threads else {}
        after["commits"] = commit_totals(metrics_url) if metrics_url else {}

    r = suite.probed_load(
        bootstrap, pid, load, read_counters, connections=16, in_flight=1, seconds=seconds
    )
    server = r["servers"][0]
    side = {
        "per_second": r["per_second"],
        "requests": r["requests"],
        "retries_14": r["retries"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "server_cores": server["cpu_share"],
        "server_cpu_us_per_request": r["server_cpu_us_per_request"],
        "server_threads_waiting_for_cpu": server["runqueue_s"] / r["seconds"],
        "loadgen_cores": r["client_cpu_share"],
        "loadgen_busy_share": r["client_busy_share"],
        "machine_busy_cores": r["machine_busy_cores"],
        "stalled_ms_per_s": r["stalled_ms_per_s"],
        "paced_by_loadgen": r["client_busy_share"] >= suite.SATURATED_CORE_SHARE,
    }
    # The machine's CPU that neither the server nor the generator used: other work.
    others = r["machine_busy_cores"] - server["cpu_share"] - r["client_cpu_share"]
    side["others_cores"] = max(0.0, others)
    side["contended"] = side["others_cores"] >= CONTENDED_CORES
    if threads:
        side["threads_us_per_request"] = breakdown(pid, before, after["threads"], r["requests"])
    if metrics_url:
        side.update(commit_figures(commits, after["commits"]))
    return side


@dataclass(frozen=True)
class Scenario:
    """A throughput row: the loads of each side and how Kafka is set up for it."""

    key: str
    title: str
    #: The load against pidctl (its bootstrap, a fresh broker base).
    pidctl_load: Callable[[str, int], cloadgen.Load]
    #: The load against Kafka (the node, a fresh broker base).
    kafka_load: Callable[[KafkaNode, int], cloadgen.Load]
    #: What the load connects to: the broker (False) or the controller listener (True).
    controller: bool = False
    #: Kafka's settings (none: the run's shared node as shipped; else a node of the row's own).
    settings: tuple[tuple[str, str], ...] = ()
    #: Readies the node for the row for the duration of its rounds.
    prepare: Callable[[KafkaNode], contextlib.AbstractContextManager[None]] = lambda node: (
        contextlib.nullcontext()
    )
    #: The baseline's settings, as the row names them.
    described: str = "as shipped"


def _transactional_load(_: Any, __: int) -> cloadgen.Load:
    return cloadgen.transactional()


@contextlib.contextmanager
def _transactions_ready(node: KafkaNode) -> Iterator[None]:
    ready_for_transactions(node)
    yield


@contextlib.contextmanager
def _flushed(node: KafkaNode) -> Iterator[None]:
    ready_for_transactions(node)
    with flushed_transaction_log(node):
        yield


def _pidctl_allocate(bootstrap: str, broker_base: int) -> cloadgen.Load:
    return cloadgen.scenario_load(bootstrap, "allocate", broker_base=broker_base)


SCENARIOS = (
    Scenario(
        "kafka-idempotent-16x1",
        "InitProducerId, 16 conn x 1",
        lambda bootstrap, base: cloadgen.idempotent(),
        lambda node, base: cloadgen.idempotent(),
    ),
    Scenario(
        "kafka-transactional-16x1",
        "InitProducerId, own transactional id, 16 conn x 1",
        _transactional_load,
        _transactional_load,
        prepare=_transactions_ready,
        described="as shipped: the new epoch appended, not synced",
    ),
    Scenario(
        "kafka-transactional-flushed-16x1",
        "InitProducerId, own transactional id, 16 conn x 1",
        _transactional_load,
        _transactional_load,
        prepare=_flushed,
        described=f"{TRANSACTION_LOG} with {'='.join(FLUSH_EVERY_APPEND)}: fsynced per append",
    ),
    Scenario(
        "kafka-allocate-durable-16x1",
        "durable AllocateProducerIds, 16 brokers x 1",
        _pidctl_allocate,
        kafka_allocate,
        controller=True,
        described="KRaft controller as shipped: a Raft batch fsynced after up to 25 ms of linger",
    ),
    Scenario(
        "kafka-allocate-durable-nolinger-16x1",
        "durable AllocateProducerIds, 16 brokers x 1",
        _pidctl_allocate,
        kafka_allocate,
        controller=True,
        settings=tuple(NO_LINGER.items()),
        described="KRaft controller with controller.quorum.append.linger.ms=0: each Raft batch "
        "appended and fsynced at once",
    ),
)


def _contended(rounds: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    return bool(rounds[0]["contended"] or rounds[1]["contended"])


def _marks(rounds: tuple[dict[str, Any], dict[str, Any]]) -> str:
    return ("(client-bound)" if rounds[1]["paced_by_loadgen"] else "") + (
        "(contended)" if _contended(rounds) else ""
    )


def _ratio(rounds: tuple[dict[str, Any], dict[str, Any]]) -> float:
    mine, kafka = rounds
    return float(mine["per_second"] / max(kafka["per_second"], 1e-9))


def _step(run: suite.Run) -> float:
    return float(run.args.seconds if run.args.short else WARM_UP_STEP_S)


def warm_up(
    run: suite.Run, node: KafkaNode, load: Callable[[], tuple[str, cloadgen.Load]]
) -> dict[str, float]:
    """Load Kafka (``load``: where, and what) until its JIT has settled (see
    :data:`WARMED_COMPILER_SHARE`); how long that took and the compiler's last share."""
    began = time.monotonic()
    while True:
        before = thread_cpu_s(node.pid)
        cloadgen.run(*load(), seconds=_step(run))
        after = thread_cpu_s(node.pid)
        groups = java_thread_groups(node.pid)
        spent = {tid: seconds - before.get(tid, 0.0) for tid, seconds in after.items()}
        compiling = sum(s for tid, s in spent.items() if "CompilerThread" in groups.get(tid, ""))
        share = compiling / max(sum(spent.values()), 1e-9)
        took = time.monotonic() - began
        if run.args.short or share < WARMED_COMPILER_SHARE or took > WARM_UP_MAX_S:
            return {"warm_up_s": took, "jit_share_after_warm_up": share}


def _beside(side: dict[str, Any]) -> dict[str, Any]:
    """A side's figures but its rate (the row's own figure)."""
    return {key: value for key, value in side.items() if key != "per_second"}


def throughput_row(run: suite.Run, scenario: Scenario) -> None:
    """pidctl and Kafka in turns (a warm-up of each first: Kafka's JIT compiles, its broker
    takes its first PID block), ``--rounds`` rounds each; the row's ratio is the median of
    the rounds in which Kafka was not client-bound."""
    seconds = run.args.seconds
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with (
        kafka_with(run, dict(scenario.settings)) as node,
        ServerProcess(run.tmp / scenario.key, events_after_start=False) as server,
        scenario.prepare(node),
    ):
        assert server.proc is not None
        kafka_bootstrap = node.controller_bootstrap if scenario.controller else node.bootstrap
        pidctl_pid = server.proc.pid

        def kafka_round(threads: bool = True) -> dict[str, Any]:
            load = scenario.kafka_load(node, run.broker_base())
            return measured(kafka_bootstrap, node.pid, load, seconds, threads=threads)

        def pidctl_round() -> dict[str, Any]:
            load = scenario.pidctl_load(server.bootstrap, run.broker_base())
            return measured(
                server.bootstrap, pidctl_pid, load, seconds, metrics_url=server.metrics_url
            )

        # Warm-ups, not counted: Kafka's JIT compiles its request path, its broker takes a
        # first block of PIDs; pidctl takes its own.
        warmed = warm_up(
            run, node, lambda: (kafka_bootstrap, scenario.kafka_load(node, run.broker_base()))
        )
        cloadgen.run(
            server.bootstrap,
            scenario.pidctl_load(server.bootstrap, run.broker_base()),
            seconds=_step(run),
        )
        for number in range(run.args.rounds):
            # Alternately first: a busy spell of the machine falls on both.
            if number % 2:
                mine = pidctl_round()
                kafka = kafka_round()
            else:
                kafka = kafka_round()
                mine = pidctl_round()
            rounds.append((mine, kafka))
    counted = [r for r in rounds if not r[1]["paced_by_loadgen"]]
    quiet = [r for r in counted if not _contended(r)]
    mine, kafka = median_by(quiet or counted, _ratio) if counted else rounds[-1]
    version = kafka_version()
    threads = kafka.pop("threads_us_per_request")
    kafka.update(warmed)
    run.row("kafka", f"Kafka {version}: {scenario.title}", kafka["per_second"], **_beside(kafka))
    print(
        "               Kafka's CPU per request by thread group (us): "
        + ", ".join(f"{name} {us:.1f}" for name, us in threads.items()),
        flush=True,
    )
    verdict: dict[str, Any] = {
        "ratio": _ratio((mine, kafka)) if counted else None,
        "client_bound": not counted,
        "machine_bound": bool(counted) and not quiet,
        "kafka_cpu_per_request_over_pidctl": kafka["server_cpu_us_per_request"]
        / max(mine["server_cpu_us_per_request"], 1e-9),
    }
    if not counted:
        verdict["why"] = (
            f"client-bound: the load generator was busy {kafka['loadgen_busy_share']:.2f} of "
            f"Kafka's window (>= {suite.SATURATED_CORE_SHARE}); not counted"
        )
    elif not quiet:
        verdict["why"] = (
            f"machine-bound: other work used >= {CONTENDED_CORES} cores in every round (here "
            f"{mine['others_cores']:.2f} and {kafka['others_cores']:.2f}); the rates say how the "
            "scheduler shared the cores; compare the CPU per request"
        )
    run.row(
        scenario.key,
        scenario.title,
        mine["per_second"],
        **_beside(mine),
        **verdict,
        baseline=f"Apache Kafka {version}, {scenario.described}",
        rounds=" ".join(f"{_ratio(r):.2f}{_marks(r)}" for r in rounds),
        rounds_counted=len(counted),
        kafka=kafka,
        kafka_threads_us_per_request=threads,
    )


def listen_backlog() -> int:
    """The largest listen backlog this machine grants (``net.core.somaxconn``): what pidctl's
    listener asks for and gets."""
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def storm_baselines() -> tuple[tuple[str, dict[str, str]], ...]:
    """Kafka as the storm meets it: as shipped (a listen backlog of 50), and with the backlog
    pidctl's listener has."""
    backlog = listen_backlog()
    return (
        ("as shipped (socket.listen.backlog.size=50)", SHIPPED),
        (
            f"socket.listen.backlog.size={backlog} (net.core.somaxconn, pidctl's backlog)",
            {"socket.listen.backlog.size": str(backlog)},
        ),
    )


#: A storm's bound: a connection Kafka's full accept queue drops waits for the kernel's SYN
#: retransmissions (1, 2, 4, ... s), minutes for the last of 10,000 on a busy machine.
STORM_DEADLINE_S = 1200.0


def _storm_figures(r: dict[str, Any]) -> dict[str, Any]:
    server = r["servers"][0]
    return {
        "served": r["served"],
        "last_served_s": r["last_served_s"],
        "p50_s": r["p50_s"],
        "p99_s": r["p99_s"],
        "retries_14": r["retries"],
        "reconnects": r["reconnects"],
        "server_cpu_s": server["cpu_s"],
        "server_cpu_us_per_producer": server["cpu_s"] * 1e6 / r["producers"],
        "server_runqueue_s": server["runqueue_s"],
        "loadgen_cpu_s": r["client_cpu_s"],
        "machine_busy_cores": r["machine_busy_cores"],
    }


def _idempotent_at(bootstrap: str) -> tuple[str, cloadgen.Load]:
    return bootstrap, cloadgen.idempotent()


def row_storm(run: suite.Run) -> None:
    """The start-up storm against pidctl and against Kafka's broker (each warmed up first
    with 16 x 1 idempotent InitProducerIds), Kafka as shipped and with pidctl's listen
    backlog: the time until the last producer is served. A producer whose connection is
    reset connects again 50 ms later (``loadgen.c``), as Kafka's clients do."""
    producers = run.args.storm
    load = cloadgen.storm_load()
    options: dict[str, Any] = {
        "connections": producers,
        "storm": True,
        "spread": 1.0,
        "deadline": STORM_DEADLINE_S,
    }
    version = kafka_version()
    kafka: list[dict[str, Any]] = []
    for described, settings in storm_baselines():
        with kafka_with(run, settings) as node:
            warmed = warm_up(run, node, partial(_idempotent_at, node.bootstrap))
            before = thread_cpu_s(node.pid)
            r = cloadgen.run(node.bootstrap, load, pids=[node.pid], **options)
            threads = breakdown(node.pid, before, thread_cpu_s(node.pid), producers)
        kafka.append(r)
        run.row(
            "kafka",
            f"Kafka {version}, {described}: storm, {producers:,} producers",
            None,
            **_storm_figures(r),
            **warmed,
            threads_us_per_producer=threads,
        )
    with ServerProcess(
        run.tmp / "kafka-storm", *suite.STORM_LIMITS, events_after_start=False
    ) as server:
        assert server.proc is not None
        cloadgen.run(server.bootstrap, cloadgen.idempotent(), seconds=_step(run))
        mine = cloadgen.run(server.bootstrap, load, pids=[server.proc.pid], **options)
    shipped, matched = kafka
    run.row(
        "kafka-storm",
        f"{producers:,} producers connect within 1 s",
        None,
        **_storm_figures(mine),
        ratio=matched["last_served_s"] / mine["last_served_s"],
        ratio_vs_shipped=shipped["last_served_s"] / mine["last_served_s"],
        kafka_cpu_over_pidctl=matched["servers"][0]["cpu_s"]
        / max(mine["servers"][0]["cpu_s"], 1e-9),
        baseline=(
            f"Apache Kafka {version} with pidctl's listen backlog (ratio), as shipped "
            "(ratio_vs_shipped): Kafka's time / pidctl's"
        ),
        curve={
            "pidctl": mine["curve"],
            "kafka": matched["curve"],
            "kafka_shipped": shipped["curve"],
        },
    )


def live_heap_bytes(pid: int) -> int:
    """The bytes of a JVM's live objects: ``jcmd PID GC.class_histogram`` (a full collection
    first, then every live object counted), its Total line."""
    histogram = subprocess.run(
        ["jcmd", str(pid), "GC.class_histogram"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    found = re.search(r"^Total\s+\d+\s+(\d+)\s*$", histogram, re.M)
    if found is None:
        raise RuntimeError(f"no Total line from jcmd GC.class_histogram:\n{histogram[-2000:]}")
    return int(found.group(1))


def create_transactional_ids(node: KafkaNode, count: int, prefix: str = "mem-") -> None:
    """``count`` new transactional ids in Kafka: an InitProducerId for each, pipelined
    :data:`IDS_PER_PIPELINE` at a time on each of :data:`ID_CONNECTIONS` connections (as many
    connections as a storm would open only fill Kafka's accept queue); an id answered 14 (no
    PID ready) is asked again."""

    def create(ids: list[str]) -> None:
        with SyncClient(node.bootstrap, timeout=120) as client:
            while ids:
                batch, ids = ids[:IDS_PER_PIPELINE], ids[IDS_PER_PIPELINE:]
                answers = client.pipeline([requests.init_producer_id(i) for i in batch])
                again = [i for i, a in zip(batch, answers, strict=True) if a.error_code.value]
                if any(a.error_code.value not in (0, *_NOT_READY) for a in answers):
                    raise RuntimeError(f"Kafka refused a transactional id: {answers}")
                if again:
                    time.sleep(cloadgen.RETRY_MS / 1000)
                    ids = again + ids

    names = [f"{prefix}{i:08d}" for i in range(count)]
    with ThreadPoolExecutor(ID_CONNECTIONS) as pool:
        list(pool.map(create, [names[k::ID_CONNECTIONS] for k in range(ID_CONNECTIONS)]))


def row_memory(run: suite.Run) -> None:
    """Bytes per transactional id: Kafka's live heap with ``--transactional-ids`` ids over
    its live heap before them; pidctl's RSS the same way (the suite's method)."""
    count = run.args.transactional_ids
    node = shared_node(run)
    ready_for_transactions(node)
    before = live_heap_bytes(node.pid)
    t0 = time.monotonic()
    create_transactional_ids(node, count)
    created_s = time.monotonic() - t0
    after = live_heap_bytes(node.pid)
    memory = suite.rss_with_transactional_ids(run.tmp / "kafka-memory", count)
    empty_kib, held_kib = memory.empty_kib, memory.held_kib
    kafka_per_id = (after - before) / count
    pidctl_per_id = (held_kib - empty_kib) * 1024 / count
    version = kafka_version()
    run.row(
        "kafka",
        f"Kafka {version}: live heap with {count:,} transactional ids",
        None,
        live_heap_mib=after / 2**20,
        live_heap_before_mib=before / 2**20,
        bytes_per_id=kafka_per_id,
        created_s=created_s,
    )
    run.row(
        "kafka-memory-per-transactional-id",
        f"bytes per transactional id, {count:,} ids",
        None,
        bytes_per_id=pidctl_per_id,
        rss_mib=held_kib / 1024,
        empty_rss_mib=empty_kib / 1024,
        ratio=kafka_per_id / pidctl_per_id,
        baseline=(
            f"Apache Kafka {version}: live heap after a full GC (pidctl: RSS, which also "
            "counts its allocator's free space); ratio Kafka's bytes / pidctl's"
        ),
    )


# -- how each server makes a grant durable ------------------------------------------------------


@contextlib.contextmanager
def counting_syncs(pid: int) -> Iterator[dict[str, int]]:
    """``strace -f -c`` on every thread of ``pid`` for the duration: the number of each of
    :data:`SYNC_CALLS` it made, filled in when the block ends."""
    counts: dict[str, int] = {}
    with tempfile.NamedTemporaryFile("r", prefix="pidctl-strace-") as summary:
        tracer = subprocess.Popen(
            [*_STRACE, "-o", summary.name, "-p", str(pid)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert tracer.stderr is not None
        deadline = time.monotonic() + STRACE_ATTACH_S
        line = tracer.stderr.readline()
        while "attached" not in line:
            if not line or time.monotonic() > deadline:
                tracer.kill()
                raise RuntimeError(f"strace did not attach to {pid}: {line.strip()}")
            line = tracer.stderr.readline()
        try:
            yield counts
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.communicate(timeout=STRACE_ATTACH_S)
        for found in re.finditer(
            r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", summary.read(), re.M
        ):
            if found.group(2) in SYNC_CALLS:
                counts[found.group(2)] = int(found.group(1))


def syncs_per_request(bootstrap: str, pid: int, load: cloadgen.Load, seconds: float) -> str:
    """What ``pid`` syncs per request answered under ``load`` (16 x 1), e.g.
    "fdatasync 0.312" (three decimals: one sync per 16 requests is 0.0625)."""
    with counting_syncs(pid) as counts:
        answered = cloadgen.run(bootstrap, load, seconds=seconds)["requests"]
    return " ".join(f"{call} {n / max(1, answered):.3f}" for call, n in sorted(counts.items())) or (
        "none"
    )


def row_syncs(run: suite.Run) -> None:
    """Durable transactional InitProducerId and AllocateProducerIds: the sync calls each
    server made per request answered, under strace (which slows both: no rates here)."""
    seconds = max(run.args.seconds, 1.0)
    node = shared_node(run)
    ready_for_transactions(node)
    transactional = cloadgen.transactional()
    with ServerProcess(run.tmp / "kafka-syncs", events_after_start=False) as server:
        assert server.proc is not None
        pidctl_pid = server.proc.pid
        found = {
            "pidctl transactional": syncs_per_request(
                server.bootstrap, pidctl_pid, transactional, seconds
            ),
            "pidctl allocate": syncs_per_request(
                server.bootstrap,
                pidctl_pid,
                _pidctl_allocate(server.bootstrap, run.broker_base()),
                seconds,
            ),
        }
    found["Kafka transactional, as shipped"] = syncs_per_request(
        node.bootstrap, node.pid, transactional, seconds
    )
    with flushed_transaction_log(node):
        found[f"Kafka transactional, {'='.join(FLUSH_EVERY_APPEND)}"] = syncs_per_request(
            node.bootstrap, node.pid, transactional, seconds
        )
    found["Kafka controller allocate"] = syncs_per_request(
        node.controller_bootstrap, node.pid, kafka_allocate(node, run.broker_base()), seconds
    )
    for name, text in found.items():
        run.row("kafka-syncs", f"{name}: sync calls per request", None, syncs=text)


def _throughput(scenario: Scenario) -> Callable[[suite.Run], None]:
    return lambda run: throughput_row(run, scenario)


#: The rows, in the order a full run measures them (the suite adds them to its own).
ROWS: dict[str, Callable[[suite.Run], None]] = {
    **{scenario.key: _throughput(scenario) for scenario in SCENARIOS},
    "kafka-storm": row_storm,
    "kafka-memory-per-transactional-id": row_memory,
    "kafka-syncs": row_syncs,
}
