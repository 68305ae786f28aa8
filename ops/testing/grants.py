"""Mixed load that remembers every acknowledged grant, and the check of a data dir against it.

Used by the storage-fault tests and by the fault campaign (``python -m ops.bench.faults``):
brokers allocating blocks, idempotent producers and transactional producers re-initialising
their ids, and (given SASL principals) named jobs of several principals, each on its own
connection, until the server goes away. Afterwards the log is read back: every acknowledged
answer must be in it, and nothing granted after a restart may overlap anything acknowledged
before.

A named job's thread runs new versions of its principal's app ids (the blocks recorded, each
version run twice: the re-run must get the same blocks or be refused), and now and then asks
for a version another principal was answered: it must be refused as not its own. What must
not happen is kept in ``Acknowledged.problems``.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from pidctl.client import AuthenticationError, SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.records import (
    JobBlockRecorded,
    ProducerIdsGranted,
    TransactionalIdUpdated,
)
from pidctl.controller.log.recovery import read_log, rebuild_state, snapshot_state
from pidctl.protocol import requests

#: Pipelined requests per round trip of each load connection.
PIPELINE = 4


#: Blocks per version of a named job (asked pipelined, as a Spark driver does).
JOB_BLOCKS = 2
#: App ids per principal, run in turn.
JOB_APPS = 3
#: How a named job's answers may be refused without anything being wrong: the version's age
#: unknown or past the window (a restart after a damaged tail, a clock), no PID ready yet.
JOB_REFUSALS = (
    ErrorCode.unknown_producer_id,
    ErrorCode.coordinator_load_in_progress,
    ErrorCode.request_timed_out,
)


@dataclass(frozen=True)
class JobBlock:
    """Block ``block`` of a named job version, answered ``first`` for ``principal``."""

    principal: str
    app_id: str
    version: int
    block: int
    first: int


def app_owner(app_id: str) -> str:
    """The principal a load's app id is meant for: ``<user>/app-N`` is ``User:<user>``'s."""
    return "User:" + app_id.split("/", 1)[0]


@dataclass
class Acknowledged:
    """What the server answered without error: blocks, idempotent PIDs, (id, PID, epoch),
    named jobs' blocks; and what the load saw that must never happen."""

    blocks: list[tuple[int, int]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    transactional: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: list[JobBlock] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Named jobs' requests refused, by error code (a refusal is no problem by itself).
    job_refusals: dict[int, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.blocks) + len(self.pids) + len(self.transactional) + len(self.jobs)


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
        principals: Sequence[tuple[str, str]] = (),
        sasl_bootstrap: str | None = None,
    ) -> None:
        """``principals``: (user, password) of each SASL principal that runs named jobs,
        over ``sasl_bootstrap`` (SCRAM-SHA-256)."""
        self.bootstrap = bootstrap
        self.cluster_id = cluster_id
        self.acked = acked
        self.sasl_bootstrap = sasl_bootstrap
        self._stop = threading.Event()
        self._threads = [
            *(threading.Thread(target=self._broker, args=(b,)) for b in brokers),
            threading.Thread(target=self._idempotent),
            *(threading.Thread(target=self._transactional, args=(t,)) for t in transactional_ids),
            *(threading.Thread(target=self._named_jobs, args=p) for p in principals),
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

    def _named_jobs(self, user: str, password: str) -> None:
        principal = f"User:{user}"
        apps = [f"{user}/app-{index}" for index in range(JOB_APPS)]
        try:
            with SyncClient(
                self.sasl_bootstrap or self.bootstrap,
                sasl=("SCRAM-SHA-256", user, password),
                timeout=10,
            ) as client:
                for step in itertools.count():
                    if self._stop.is_set():
                        return
                    # A version newer than any before it, across restarts too.
                    version = time.time_ns() // 1000
                    self._run_version(client, principal, apps[step % JOB_APPS], version)
                    self._intrude(client, principal)
        except (ConnectionError, OSError, AuthenticationError):
            return

    def _blocks(self, client: SyncClient, app_id: str, version: int) -> list[tuple[int, int]]:
        keys = [JobKey(app_id, version, block).client_id() for block in range(JOB_BLOCKS)]
        answers = client.pipeline([requests.allocate(-1, -1)] * JOB_BLOCKS, keys)
        return [(int(a.error_code), int(a.producer_id_start)) for a in answers]

    def _run_version(self, client: SyncClient, principal: str, app_id: str, version: int) -> None:
        """A version's first run, then its re-run: the same blocks, or refused."""
        acked = self.acked
        first = self._blocks(client, app_id, version)
        granted = [(b, start) for b, (error, start) in enumerate(first) if error == 0]
        with acked.lock:
            for block, start in granted:
                acked.jobs.append(JobBlock(principal, app_id, version, block, start))
            refused = False  # blocks are asked for in order: after a refusal, out of order
            for block, (error, _) in enumerate(first):
                in_order = error == ErrorCode.invalid_request and refused
                if error and error not in JOB_REFUSALS and not in_order:
                    acked.problems.append(f"{principal}'s {app_id} {version}/{block}: {error}")
                elif error:
                    acked.job_refusals[error] = acked.job_refusals.get(error, 0) + 1
                refused = refused or error != 0
        again = self._blocks(client, app_id, version)
        with acked.lock:
            for block, start in granted:
                error, answer = again[block]
                if (error, answer) != (0, start) and error not in JOB_REFUSALS:
                    acked.problems.append(
                        f"{principal}'s re-run of {app_id} {version}/{block}: {error} at "
                        f"{answer}, its first run got {start}"
                    )

    def _intrude(self, client: SyncClient, principal: str) -> None:
        """Ask for a version another principal was answered: refused, never its blocks."""
        acked = self.acked
        with acked.lock:
            theirs = next((j for j in reversed(acked.jobs) if j.principal != principal), None)
        if theirs is None:
            return
        key = JobKey(theirs.app_id, theirs.version, theirs.block).client_id()
        (answer,) = client.pipeline([requests.allocate(-1, -1)], [key])
        if answer.error_code != ErrorCode.transactional_id_authorization_failed:
            with acked.lock:
                acked.problems.append(
                    f"{principal} asked {theirs.principal}'s {theirs.app_id} "
                    f"{theirs.version}/{theirs.block}: {answer.error_code} at "
                    f"{answer.producer_id_start}, not TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
                )


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
    snapshot = snapshot_state(contents)
    # Segments below the snapshot may be gone; what they granted is below its mark.
    floor = snapshot.next_producer_id if snapshot is not None and contents.snapshot_offset else 0
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
    job_records = [e.record for e in contents.entries() if isinstance(e.record, JobBlockRecorded)]
    recorded_jobs = {
        JobBlock(r.principal or "", r.app_id, r.version, r.block, r.first_producer_id)
        for r in job_records
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
    for job in acked.jobs:
        if job not in recorded_jobs and job.first >= floor:
            lost.append(f"{job.principal}'s {job.app_id} {job.version}/{job.block} at {job.first}")
    twice: list[str] = []
    for record in job_records:  # an app id recorded for a principal it is not meant for
        if record.principal != app_owner(record.app_id):
            twice.append(f"{record.app_id} {record.version}/{record.block} of {record.principal}")
    # A job's block answered again (a re-run) is one range.
    job_ranges = {(job.first, job.first + 1000) for job in acked.jobs}
    handed = sorted(
        [(f, f + n) for f, n in acked.blocks] + [(p, p + 1) for p in acked.pids] + [*job_ranges]
    )
    for (a_first, a_end), (b_first, b_end) in itertools.pairwise(handed):
        if b_first < a_end:
            twice.append(f"[{a_first}, {a_end}) and [{b_first}, {b_end})")
    # A transactional producer id may repeat (epoch bumps); it must never be a block's or
    # another id's idempotent PID.
    blocks = sorted([(f, f + n) for f, n in acked.blocks] + [*job_ranges])
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
