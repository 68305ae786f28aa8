"""Property: replaying any log rebuilds exactly the state that wrote it.

Hypothesis drives the real Controller with random request sequences (registrations with new
and old incarnations, heartbeats, unregistrations, allocations with right and wrong epochs,
time passing). The records it produced are then replayed onto a fresh state, from scratch
and from a snapshot taken at a random point, and through real files with the real log.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import cast

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.pool_grants import PoolGrants, for_pool
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.logformat import scan_segment
from pidctl.controller.core.records import Record
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.log.recovery import read_log, rebuild_state, recover
from pidctl.protocol import requests
from pidctl.protocol.codec import decode_request, encode_request
from tests import wire
from tests.controller.core.snapshots import through_snapshot
from tests.controller.decide import decide

CLUSTER = "replay-cluster"
INCARNATIONS = [uuid.UUID(int=i) for i in range(4)]

operation = st.one_of(
    st.tuples(st.just("register"), st.integers(0, 3), st.sampled_from(INCARNATIONS)),
    st.tuples(st.just("heartbeat"), st.integers(0, 3), st.integers(-1, 40)),
    st.tuples(st.just("allocate"), st.integers(-1, 3), st.integers(-1, 40)),
    st.tuples(st.just("allocate_current"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("unregister"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("sleep"), st.integers(0, 20_000), st.just(0)),
    st.tuples(st.just("init_idempotent"), st.just(0), st.just(0)),
    st.tuples(st.just("init_transactional"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("expire"), st.just(0), st.just(0)),
    # A lease from etcd (a gap in the counter, a size in blocks), and an import's floor.
    st.tuples(st.just("lease"), st.integers(0, 5000), st.integers(1, 4)),
    st.tuples(st.just("floor"), st.integers(1, 5000), st.just(0)),
    # A named job's block (app, version, block: in order, again, out of order, older) and
    # the job allocations' expiry.
    st.tuples(st.just("job"), st.integers(0, 2), st.tuples(st.integers(0, 3), st.integers(0, 2))),
    st.tuples(st.just("expire_jobs"), st.just(0), st.just(0)),
    # Start-up cut a damaged tail: job versions not in the log refused, transactional ids
    # moved to new producer ids.
    st.tuples(st.just("damaged_tail"), st.integers(1, 100), st.just(0)),
)


class ListSink:
    """An in-memory record sink: the log without the disk, for the pure core."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, Record]] = []

    def append_entry(self, entry: bytes) -> int:
        scan = scan_segment(entry, len(self.entries))
        (decoded,) = scan.entries
        self.entries.append((decoded.offset, decoded.record))
        return decoded.offset


def _request(body: object, supported: object, client_id: str = "prop") -> object:
    encoded = encode_request(body, 1, client_id)  # type: ignore[arg-type]
    return decode_request(encoded[4:], supported)  # type: ignore[arg-type]


def drive(
    quorum: QuorumController, pool_grants: PoolGrants, ops: list[tuple[str, int, object]]
) -> None:
    controller = Controller(quorum, pool_grants=pool_grants)
    clock = 0
    conn = ConnectionInfo()
    for kind, a, b in ops:
        now = Now(clock, clock)
        if kind == "sleep":
            clock += a
            continue
        if kind == "expire":
            quorum.expire_transactional_ids(now, limit=2)  # in steps of two
            continue
        if kind == "expire_jobs":
            quorum.expire_job_allocations(now, limit=2)
            continue
        if kind == "damaged_tail":
            quorum.apply(quorum.state.damaged_tail(a, now.wall_ms, now.mono_ms), now)
            continue
        if kind == "job":
            version, block = cast(tuple[int, int], b)
            key = JobKey(f"app-{a}", version, block).client_id()
            request = _request(wire.allocate(-1, -1), controller.supported, key)
            decide(controller, request, now, conn)  # type: ignore[arg-type]
            continue
        producer_ids, leases = controller.state.producer_ids, controller.state.leases
        if kind == "lease":
            counter = leases.high_water() + a
            first, end = leases.lease_bounds(counter, int(b) * 1000)  # type: ignore[call-overload]
            quorum.apply(leases.lease(first, end, "etcd://x/p", 1), now)
            continue
        if kind == "floor":
            quorum.apply(producer_ids.raise_floor(leases.high_water() + a, "zk"), now)
            continue
        if kind == "init_idempotent":
            body: object = requests.init_producer_id(None)
        elif kind == "init_transactional":
            body = _init_transactional(controller, f"tx-{a}", int(b))  # type: ignore[call-overload]
        elif kind == "register":
            body = wire.registration(a, CLUSTER, b)  # type: ignore[arg-type]
        elif kind == "heartbeat":
            body = wire.heartbeat(a, int(b))  # type: ignore[call-overload]
        elif kind == "allocate":
            body = wire.allocate(a, int(b))  # type: ignore[call-overload]
        elif kind == "allocate_current":
            registration = controller.state.cluster.brokers.get(a)
            body = wire.allocate(a, registration.epoch if registration else -1)
        else:
            body = wire.unregister(a)
        decide(controller, _request(body, controller.supported), now, conn)  # type: ignore[arg-type]


def _init_transactional(controller: Controller, transactional_id: str, mode: int) -> object:
    """Mode 0: a plain init; 1: KIP-360 with the current pair; 2: with a stale pair;
    3: a retry carrying the last epoch."""
    held = controller.state.transactions.transactional_ids.get(transactional_id)
    if mode == 0 or held is None:
        return requests.init_producer_id(transactional_id)
    epoch = {1: held.producer_epoch, 2: 0, 3: held.last_producer_epoch}[mode]
    return requests.init_producer_id(
        transactional_id, producer_id=held.producer_id, producer_epoch=max(epoch, 0)
    )


def _fresh_quorum(sink: object) -> tuple[QuorumController, PoolGrants]:
    state = ControllerState().configure(
        transactional_id_expiration_ms=10_000,
        job_allocation_reuse_ms=10_000,
        job_allocation_expiration_ms=20_000,
    )
    pool_grants = for_pool(state)
    quorum = QuorumController(state, sink, (pool_grants.applied,))  # type: ignore[arg-type]
    quorum.apply(state.cluster.create_cluster(CLUSTER, 1), Now(0, 0))
    return quorum, pool_grants


@given(ops=st.lists(operation, max_size=60), cut=st.integers(0, 200))
def test_replay_from_scratch_and_from_any_snapshot(
    ops: list[tuple[str, int, object]], cut: int
) -> None:
    sink = ListSink()
    quorum, pool_grants = _fresh_quorum(sink)
    drive(quorum, pool_grants, ops)

    replayed = ControllerState()
    for offset, record in sink.entries:
        replayed.replay(offset, record)
    assert replayed == quorum.state

    cut = min(cut, len(sink.entries))
    partial = ControllerState()
    for offset, record in sink.entries[:cut]:
        partial.replay(offset, record)
    resumed = through_snapshot(partial)
    for offset, record in sink.entries[cut:]:
        resumed.replay(offset, record)
    assert resumed == quorum.state


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(operation, max_size=60), interval=st.integers(1, 12))
def test_replay_through_real_files_with_snapshots(
    ops: list[tuple[str, int, object]], interval: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)

        async def main() -> ControllerState:
            quorum: QuorumController
            metalog = MetadataLog(
                data_dir, 0, 0, lambda: quorum.snapshot(), snapshot_interval_records=interval
            )
            quorum, pool_grants = _fresh_quorum(metalog)
            async with trio.open_nursery() as nursery:
                await nursery.start(metalog.run)
                for index, op in enumerate(ops):
                    drive(quorum, pool_grants, [op])
                    # Vary the group-commit batches: sometimes wait for the disk, sometimes not.
                    if index % 3 == 0:
                        await metalog.flush()
                    else:
                        await trio.sleep(0)
                await metalog.flush()
                nursery.cancel_scope.cancel()
            return quorum.state

        written = trio.run(main)
        # The streaming recovery and the tools' whole-log reader agree.
        assert rebuild_state(read_log(data_dir))[0] == written
        assert recover(data_dir).state == written
