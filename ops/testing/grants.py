"""Mixed load that remembers every acknowledged grant, and the check of a data dir against it.

Used by the storage-fault tests and by the fault campaign (``python -m ops.bench.faults``):
brokers allocating blocks, idempotent producers and transactional producers re-initialising
their ids, each on its own connection, until the server goes away. Afterwards the log is
read back: every acknowledged answer must be in it, and nothing granted after a restart may
overlap anything acknowledged before.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pidctl.client import SyncClient
from pidctl.controller.core.records import ProducerIdsGranted, TransactionalIdUpdated
from pidctl.controller.log.recovery import read_log, rebuild_state
from pidctl.protocol import requests

#: Pipelined requests per round trip of each load connection.
PIPELINE = 4


@dataclass
class Acknowledged:
    """What the server answered without error: blocks, idempotent PIDs, (id, PID, epoch)."""

    blocks: list[tuple[int, int]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    transactional: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return len(self.blocks) + len(self.pids) + len(self.transactional)


class GrantLoad:
    """Threads that load one server until it stops answering (or :meth:`stop`)."""

    def __init__(
        self,
        bootstrap: str,
        cluster_id: str,
        acked: Acknowledged,
        *,
        brokers: tuple[int, ...] = (1, 2),
        transactional_ids: tuple[str, ...] = ("tx-a", "tx-b"),
    ) -> None:
        self.bootstrap = bootstrap
        self.cluster_id = cluster_id
        self.acked = acked
        self._stop = threading.Event()
        self._threads = [
            *(threading.Thread(target=self._broker, args=(b,)) for b in brokers),
            threading.Thread(target=self._idempotent),
            *(threading.Thread(target=self._transactional, args=(t,)) for t in transactional_ids),
        ]

    def start(self) -> GrantLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _broker(self, broker_id: int) -> None:
        # The same incarnation each time: after a restart it keeps its epoch.
        incarnation = uuid.UUID(int=broker_id)
        try:
            with SyncClient(self.bootstrap, timeout=10) as client:
                registration = requests.registration(broker_id, self.cluster_id, incarnation)
                epoch = int(client.request(registration).broker_epoch)
                while not self._stop.is_set():
                    for r in client.pipeline([requests.allocate(broker_id, epoch)] * PIPELINE):
                        if r.error_code == 0:
                            with self.acked.lock:
                                self.acked.blocks.append((r.producer_id_start, r.producer_id_len))
        except (ConnectionError, OSError):
            return

    def _idempotent(self) -> None:
        try:
            with SyncClient(self.bootstrap, timeout=10) as client:
                while not self._stop.is_set():
                    for r in client.pipeline([requests.init_producer_id()] * PIPELINE):
                        if r.error_code == 0:
                            with self.acked.lock:
                                self.acked.pids.append(r.producer_id)
        except (ConnectionError, OSError):
            return

    def _transactional(self, transactional_id: str) -> None:
        try:
            with SyncClient(self.bootstrap, timeout=10) as client:
                while not self._stop.is_set():
                    r = client.request(requests.init_producer_id(transactional_id))
                    if r.error_code == 0:
                        with self.acked.lock:
                            self.acked.transactional.append(
                                (transactional_id, r.producer_id, r.producer_epoch)
                            )
        except (ConnectionError, OSError):
            return


@dataclass(frozen=True)
class Verdict:
    """How a data dir compares with what was acknowledged."""

    checked: int
    lost: list[str]
    handed_out_twice: list[str]


def check_data_dir(data_dir: Path, acked: Acknowledged) -> Verdict:
    """Every acknowledged answer is in the log, and no PID was handed out twice."""
    contents = read_log(data_dir)
    rebuild_state(contents)  # raises if the log does not replay
    grants = [e.record for e in contents.entries() if isinstance(e.record, ProducerIdsGranted)]
    if contents.snapshot_state is not None and contents.snapshot_offset:
        # Segments below the snapshot may be gone; what they granted is below its mark.
        floor = int(contents.snapshot_state["next_producer_id"])
    else:
        floor = 0
    broker_blocks = {
        (g.first_producer_id, g.next_producer_id - g.first_producer_id)
        for g in grants
        if g.holder == "broker"
    }
    controller_blocks = [
        (g.first_producer_id, g.next_producer_id) for g in grants if g.holder == "controller"
    ]
    updates = {
        (e.record.transactional_id, e.record.producer_id, e.record.producer_epoch)
        for e in contents.entries()
        if isinstance(e.record, TransactionalIdUpdated)
    }
    lost: list[str] = []
    for first, length in acked.blocks:
        if (first, length) not in broker_blocks and first >= floor:
            lost.append(f"block {first}+{length}")
    controller_blocks.sort()
    starts = [first for first, _ in controller_blocks]
    for pid in acked.pids:
        index = bisect.bisect_right(starts, pid) - 1
        inside = index >= 0 and pid < controller_blocks[index][1]
        if not inside and pid >= floor:
            lost.append(f"idempotent pid {pid}")
    for answer in acked.transactional:
        if answer not in updates and answer[1] >= floor:
            lost.append(f"transactional {answer}")
    twice: list[str] = []
    handed = sorted([(f, f + n) for f, n in acked.blocks] + [(p, p + 1) for p in acked.pids])
    for (a_first, a_end), (b_first, b_end) in itertools.pairwise(handed):
        if b_first < a_end:
            twice.append(f"[{a_first}, {a_end}) and [{b_first}, {b_end})")
    # A transactional producer id may repeat (epoch bumps); it must never be a block's or
    # another id's idempotent PID.
    blocks = sorted((f, f + n) for f, n in acked.blocks)
    block_starts = [first for first, _ in blocks]
    idempotent = set(acked.pids)
    holders: dict[int, str] = {}
    for tid, pid, _ in acked.transactional:
        index = bisect.bisect_right(block_starts, pid) - 1
        in_block = index >= 0 and pid < blocks[index][1]
        if pid in idempotent or in_block:
            twice.append(f"transactional {tid} pid {pid}")
        if holders.setdefault(pid, tid) != tid:
            twice.append(f"pid {pid} of both {holders[pid]} and {tid}")
    return Verdict(acked.count, lost, twice)
