"""Damage to the newest, synced records of a real data dir: a flipped bit at every byte of
the last record, a truncation at every offset of the last segment, an emptied newest segment.
Start-up cannot tell any of them from a write a crash cut short, and must never grant a PID
that the lost records had granted (``docs/log-format.md``, "Reservations").

The data dir is written by the real server under load and SIGKILLed: every answer it gave
was synced. Every damaged copy is recovered by the start-up code itself (``recover`` and
``ProducerIdControlManager.resume``, what ``pidctl serve`` runs before it listens), which
says where grants go on; a representative sample is then served by the real server, whose
grants are checked against everything acknowledged before the damage.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from ops.bench.common import first_overlap
from ops.testing.serverproc import ServerProcess, format_data_dir, wait_until
from pidctl.client import SyncClient
from pidctl.controller.core.job_commits import CommitKey
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.logformat import SEGMENT_SUFFIX
from pidctl.controller.core.records import (
    RECORD_TYPES,
    SNAPSHOT_RECORDS,
    ClusterCreated,
    DamagedTailTruncated,
    JobAllocationExpired,
    JobClockAdvanced,
    ProducerIdsGranted,
    TransactionalIdExpired,
)
from pidctl.controller.log.datadir import DAMAGED_TAIL_FILE, RESERVATION_FILE
from pidctl.controller.log.logtools import verify
from pidctl.controller.log.recovery import read_log, recover
from pidctl.protocol import requests

pytestmark = pytest.mark.slow

#: Small segments (the last one is short, every offset of it is tried) and small
#: reservations (one every two blocks: lost tails hold reservations as well as grants).
RESERVATION = 2000
SETTINGS = ("--segment-max-bytes", "2500", "--producer-id-reservation", str(RESERVATION))


@dataclass(frozen=True)
class Written:
    """A data dir the real server wrote and was SIGKILLed on, and what it acknowledged."""

    data_dir: Path
    acknowledged: list[tuple[int, int]]  # (first PID, count): blocks and idempotent PIDs
    last_segment: Path
    #: Where each record of the last segment starts, and where the segment ends.
    record_starts: list[int]

    @property
    def highest_end(self) -> int:
        return max(first + count for first, count in self.acknowledged)


def _grant(client: SyncClient, acknowledged: list[tuple[int, int]]) -> None:
    """A job's block and an idempotent PID, each acknowledged (so synced) before the next."""
    block = client.request(requests.allocate(-1, -1))
    assert block.error_code == 0
    acknowledged.append((block.producer_id_start, block.producer_id_len))
    pid = client.request(requests.init_producer_id())
    assert pid.error_code == 0
    acknowledged.append((pid.producer_id, 1))


def _record_starts(data: bytes) -> list[int]:
    """Where each record starts (its u32 length prefix says where the next one does)."""
    starts, position = [], 0
    while position < len(data):
        starts.append(position)
        (length,) = struct.unpack_from(">I", data, position)
        position += 8 + length
    assert position == len(data)
    return starts


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    data_dir = tmp_path_factory.mktemp("tail-damage") / "d"
    acknowledged: list[tuple[int, int]] = []
    server = ServerProcess(data_dir, *SETTINGS).start()
    try:
        with SyncClient(server.bootstrap) as client:
            for _ in range(30):
                _grant(client, acknowledged)
            # Then grants to a job until the newest segment holds several records: the last
            # record is one of them, acknowledged, so synced.
            while True:
                last = client.request(requests.allocate(-1, -1))
                assert last.error_code == 0
                acknowledged.append((last.producer_id_start, last.producer_id_len))
                newest = max(data_dir.glob("*" + SEGMENT_SUFFIX))
                if newest.stat().st_size > 1000:
                    break
    finally:
        server.kill()  # SIGKILL: no clean shutdown, the reservation stays ahead
    segments = sorted(data_dir.glob("*" + SEGMENT_SUFFIX))
    assert len(segments) >= 3, "the log should span several segments"
    record = read_log(data_dir).entries()[-1].record
    assert isinstance(record, ProducerIdsGranted) and record.first_producer_id == (
        last.producer_id_start
    )
    starts = _record_starts(segments[-1].read_bytes())
    assert len(starts) >= 4, "the last segment should hold several records"
    return Written(data_dir, acknowledged, segments[-1], starts)


def _resumed_at(data_dir: Path) -> int:
    """Where the restarted server's first grant would start: start-up's own steps."""
    recovery = recover(data_dir)
    state = recovery.state.configure(reservation_size=RESERVATION)
    for record in state.producer_ids.resume(recovery.reservation).records:
        state.replay(state.next_offset, record)
    start = state.producer_ids.next_block_start()
    assert start is not None
    return start


def _every_damage(
    written: Written,
    damages: list[tuple[str, bytes]],
    check: Callable[[Path], None] | None = None,
) -> list[str]:
    """Each damaged last segment in a copy of the data dir, recovered: the cases whose
    grants would go on below what was acknowledged."""
    work = written.data_dir.parent / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(written.data_dir, work)
    segment = work / written.last_segment.name
    wrong = []
    for what, data in damages:
        segment.write_bytes(data)  # recovery only ever changes this file
        if check is not None:
            check(work)
        resumed = _resumed_at(work)
        if resumed < written.highest_end:
            wrong.append(f"{what}: grants go on at {resumed}, below {written.highest_end}")
    shutil.rmtree(work)
    return wrong


def test_a_flipped_bit_at_every_byte_of_the_last_record(written: Written) -> None:
    data = written.last_segment.read_bytes()
    start = written.record_starts[-1]
    damages = []
    for position in range(start, len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 1 << (position % 8)
        damages.append((f"bit {position % 8} of byte {position}", bytes(flipped)))

    def verify_says_so(work: Path) -> None:
        report = verify(work)
        assert not report.ok and report.lines[-1].startswith("DAMAGED TAIL")
        said = re.search(r"a start-up now grants from (\d+)", "\n".join(report.lines))
        assert said and int(said.group(1)) >= written.highest_end, report.lines

    assert _every_damage(written, damages, verify_says_so) == []
    assert len(damages) == len(data) - start > 100


def test_a_truncation_at_every_offset_of_the_last_segment(written: Written) -> None:
    data = written.last_segment.read_bytes()
    damages = [(f"cut at byte {size}", data[:size]) for size in range(len(data))]
    assert damages[0][1] == b""  # the emptied newest segment is one of them
    assert _every_damage(written, damages) == []


def _pidctl(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pidctl.controller.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _damaged(written: Written, case: str) -> bytes:
    data = written.last_segment.read_bytes()
    last, middle = written.record_starts[-1], written.record_starts[len(written.record_starts) // 2]
    if case.startswith("flip"):
        position = last + (2 if case == "flip header" else (len(data) - last) // 2)
        flipped = bytearray(data)
        flipped[position] ^= 0x10
        return bytes(flipped)
    cuts = {
        "cut inside the last record": last + 11,
        "cut before the last record": last,
        "cut half the segment": middle,
        "empty the newest segment": 0,
    }
    return data[: cuts[case]]


@pytest.mark.parametrize(
    "case",
    [
        "flip header",
        "flip payload",
        "cut inside the last record",
        "cut before the last record",
        "cut half the segment",
        "empty the newest segment",
    ],
)
def test_the_real_server_on_damaged_tails_grants_no_pid_twice(
    written: Written, tmp_path: Path, case: str
) -> None:
    data_dir = tmp_path / "d"
    shutil.copytree(written.data_dir, data_dir)
    (data_dir / written.last_segment.name).write_bytes(_damaged(written, case))
    checked = _pidctl("log", "verify", "--data-dir", str(data_dir))
    if "inside" in case or case.startswith("flip"):
        assert checked.returncode == 1 and "DAMAGED TAIL" in checked.stdout, checked.stdout
    after: list[tuple[int, int]] = []
    with ServerProcess(data_dir, *SETTINGS) as server, SyncClient(server.bootstrap) as client:
        for _ in range(3):
            _grant(client, after)
    assert first_overlap(written.acknowledged + after) is None, (case, after)
    assert min(first for first, _ in after) >= written.highest_end
    assert _pidctl("log", "verify", "--data-dir", str(data_dir)).returncode == 0


def test_a_lost_reservation_file_stops_start_up_until_an_operators_word(
    written: Written, tmp_path: Path
) -> None:
    data_dir = tmp_path / "d"
    shutil.copytree(written.data_dir, data_dir)
    (data_dir / RESERVATION_FILE).unlink()
    with pytest.raises(RuntimeError, match="missing, but the log reserved producer ids up to"):
        ServerProcess(data_dir, *SETTINGS).start()
    assert _pidctl("log", "verify", "--data-dir", str(data_dir)).returncode == 1
    word = written.highest_end + 50_000
    said = _pidctl("log", "reserve", "--data-dir", str(data_dir), "--producer-id", str(word))
    assert said.returncode == 0 and f"the next start grants from {word}" in said.stdout
    after: list[tuple[int, int]] = []
    with ServerProcess(data_dir, *SETTINGS) as server, SyncClient(server.bootstrap) as client:
        _grant(client, after)
        busy = _pidctl("log", "reserve", "--data-dir", str(data_dir), "--producer-id", "0")
        assert busy.returncode == 1 and "stop the controller first" in busy.stderr
    assert min(first for first, _ in after) >= word


# -- each record type in last position ------------------------------------------------------
#
# The damage above is to grants; what a lost record *answered* matters too. For each record
# type the server writes, a data dir whose newest record is of that type (acknowledged, so
# synced) gets a flipped bit in it, and the real server restarted on it answers every
# earlier question as before or refuses it: a named job version gets its first blocks or
# UNKNOWN_PRODUCER_ID (a version not in the log is refused for the reuse window), a
# transactional id never the same (PID, epoch) twice (it moves to a new PID), and no PID is
# handed out twice.


@dataclass
class Answered:
    """What a server acknowledged: PID ranges, named job versions' blocks, the pairs "tx"
    was given."""

    ranges: list[tuple[int, int]]
    jobs: dict[tuple[str, int], list[int]]
    pairs: set[tuple[int, int]]
    committed: set[tuple[str, int]] = field(default_factory=set)


class Asking:
    """A client of one server that remembers every answer it was given."""

    def __init__(self, server: ServerProcess, answered: Answered) -> None:
        self.server = server
        self.answered = answered

    def job(self, app: str, version: int, blocks: int = 2) -> list[int]:
        keys = [JobKey(app, version, block).client_id() for block in range(blocks)]
        with SyncClient(self.server.bootstrap) as client:
            answers = client.pipeline([requests.allocate(-1, -1)] * blocks, keys)
        assert all(a.error_code == 0 for a in answers), answers
        starts = [a.producer_id_start for a in answers]
        self.answered.ranges += [(start, 1000) for start in starts]
        self.answered.jobs[(app, version)] = starts
        return starts

    def commit(self, app: str, version: int) -> None:
        """Commit a job version (``core/job_commits.py``): its blocks are then answered
        DUPLICATE_SEQUENCE_NUMBER, with the block."""
        with SyncClient(self.server.bootstrap) as client:
            (answer,) = client.pipeline(
                [requests.allocate(-1, -1)], [CommitKey(app, version).client_id()]
            )
        assert answer.error_code == 0, answer
        self.answered.committed.add((app, version))

    def tx(self) -> None:
        with SyncClient(self.server.bootstrap) as client:
            answer = client.request(requests.init_producer_id("tx"))
        assert answer.error_code == 0
        self.answered.pairs.add((answer.producer_id, answer.producer_epoch))

    def broker_block(self, broker: int = 1) -> None:
        with SyncClient(self.server.bootstrap) as client:
            epoch = client.request(
                requests.registration(broker, self.server.cluster_id(), uuid.UUID(int=broker))
            ).broker_epoch
            block = client.request(requests.allocate(broker, epoch))
        assert block.error_code == 0
        self.answered.ranges.append((block.producer_id_start, block.producer_id_len))

    def request(self, body: object) -> None:
        with SyncClient(self.server.bootstrap) as client:
            assert client.request(body).error_code == 0  # type: ignore[arg-type]


#: Settings under which the newest record is an expiry's (looked at often, expiring soon).
EXPIRING = {
    "TransactionalIdExpired": ("--transactional-id-expiration-ms", "1000"),
    "JobAllocationExpired": (
        *("--job-allocation-reuse-ms", "3000", "--job-allocation-expiration-ms", "6000"),
    ),
    "JobClockAdvanced": (
        *("--job-allocation-reuse-ms", "10000", "--job-allocation-expiration-ms", "20000"),
    ),
}


def _newest(data_dir: Path) -> object:
    return read_log(data_dir).entries()[-1].record


def _wait_newest(server: ServerProcess, kind: type) -> None:
    wait_until(lambda: isinstance(_newest(server.data_dir), kind), f"a {kind.__name__} last", 30)


def _write_history(data_dir: Path, last: str) -> Answered:
    """A data dir the real server wrote, whose newest record is of type ``last``."""
    answered = Answered([], {}, set())
    settings: tuple[str, ...] = ()
    if last in EXPIRING:
        settings = ("--transactional-id-cleanup-interval-ms", "100", *EXPIRING[last])
    server = ServerProcess(data_dir, *settings)
    asking = Asking(server.start(), answered)
    try:
        asking.broker_block()
        asking.job("app", 1)
        asking.tx()
        asking.tx()
        if last == "ClusterCreated":
            raise AssertionError("made by format alone")
        if last == "JobBlockRecorded":
            asking.job("app", 2)
        elif last == "JobVersionCommitted":
            asking.commit("app", 1)
        elif last == "ProducerIdsGranted":
            asking.broker_block()
        elif last == "TransactionalIdUpdated":
            asking.tx()
        elif last == "BrokerRegistered":
            asking.request(requests.registration(2, server.cluster_id(), uuid.UUID(int=2)))
        elif last == "BrokerUnregistered":
            asking.request(requests.unregister(1))
        elif last == "ProducerIdsReserved":  # a clean stop lowers the reservation, last
            assert server.terminate() == 0
        elif last == "ControllerStarted":  # after a clean stop, a start writes only this
            assert server.terminate() == 0
            server.start()
        elif last == "ProducerIdFloorRaised":  # after a crash, a start raises the floor
            server.kill()
            server.start()
        elif last == "TransactionalIdExpired":
            _wait_newest(server, TransactionalIdExpired)
        elif last == "JobAllocationExpired":
            _wait_newest(server, JobAllocationExpired)
        elif last == "JobClockAdvanced":
            _wait_newest(server, JobClockAdvanced)
        elif last == "DamagedTailTruncated":  # a start on a damaged tail records it, last
            server.kill()
            _flip_newest(data_dir, "flip payload")
            server.start()
    finally:
        server.kill()
    assert type(_newest(data_dir)).__name__ == last
    return answered


def _flip_newest(data_dir: Path, how: str) -> None:
    """Flip a bit in the newest record (its length field, or the middle of its payload);
    the preallocated zeros after it a SIGKILL left are not its."""
    segment = max(data_dir.glob("*" + SEGMENT_SUFFIX))
    data = bytearray(segment.read_bytes())
    start = end = 0
    while end + 4 <= len(data) and (length := struct.unpack_from(">I", data, end)[0]):
        start, end = end, end + 8 + length
    position = start + (2 if how == "flip header" else (end - start) // 2)
    data[position] ^= 0x10
    segment.write_bytes(bytes(data))


def _check_after_damage(data_dir: Path, answered: Answered) -> None:
    """The real server on the damaged data dir: every earlier question answered as before
    or refused; nothing handed out twice; a new version refused (it may be a lost one)."""
    after: list[tuple[int, int]] = []
    server = ServerProcess(data_dir).start()
    try:
        asking = Asking(server, Answered(after, {}, set()))
        for (app, version), starts in answered.jobs.items():
            keys = [JobKey(app, version, block).client_id() for block in range(len(starts))]
            with SyncClient(server.bootstrap) as client:
                answers = client.pipeline([requests.allocate(-1, -1)] * len(keys), keys)
            # Its first blocks, or refused: as a version whose age is unknown, or (once a
            # newer version of the app was answered) as an older version.
            superseded = any(a == app and v > version for a, v in answered.jobs)
            for answer, start in zip(answers, starts, strict=True):
                assert (answer.error_code, answer.producer_id_start) in {
                    (0, start),
                    (ErrorCode.unknown_producer_id, 0),
                    *([(ErrorCode.producer_fenced, 0)] if superseded else []),
                    # (its commit kept: "written already", with the block)
                    *(
                        [(ErrorCode.duplicate_sequence_number, start)]
                        if (app, version) in answered.committed
                        else []
                    ),
                }, (app, version, answer)
        with SyncClient(server.bootstrap) as client:
            (fresh,) = client.pipeline(
                [requests.allocate(-1, -1)], [JobKey("new", 1, 0).client_id()]
            )
        assert fresh.error_code == ErrorCode.unknown_producer_id  # it may be a lost version
        asking.tx()
        assert not asking.answered.pairs & answered.pairs  # a new PID, not a lost epoch
        asking.broker_block(3)
        with SyncClient(server.bootstrap) as client:
            pid = client.request(requests.init_producer_id())
        after.append((pid.producer_id, 1))
    finally:
        server.kill()
    assert first_overlap(answered.ranges + after) is None
    # A transactional id keeps its PID across epochs; that PID is nobody else's.
    tx_pids = [(pid, 1) for pid in {pid for pid, _ in answered.pairs | asking.answered.pairs}]
    assert first_overlap(answered.ranges + after + tx_pids) is None
    assert not (data_dir / DAMAGED_TAIL_FILE).exists()  # recorded in the log, the note gone
    assert isinstance(_newest(data_dir), DamagedTailTruncated | ProducerIdsGranted)


LAST_RECORDS = [
    "JobBlockRecorded",
    "JobVersionCommitted",
    "ProducerIdsGranted",
    "TransactionalIdUpdated",
    "BrokerRegistered",
    "BrokerUnregistered",
    "ControllerStarted",
    "ProducerIdFloorRaised",
    "ProducerIdsReserved",
    "TransactionalIdExpired",
    "JobAllocationExpired",
    "JobClockAdvanced",
    "DamagedTailTruncated",
]


def test_every_record_type_a_server_writes_last_is_tried() -> None:
    """ClusterCreated is written by ``pidctl format`` alone (below), ProducerIdsLeased only
    with etcd (a fleet serves no named job; its grants are covered as above); a snapshot's
    own records are never in the log."""
    assert set(LAST_RECORDS) | {"ClusterCreated", "ProducerIdsLeased"} == {
        cls.__name__ for cls in RECORD_TYPES.values() if cls not in SNAPSHOT_RECORDS
    }


@pytest.mark.parametrize("last", LAST_RECORDS)
def test_a_flipped_bit_in_the_newest_record_of_each_type_changes_no_answer(
    tmp_path: Path, last: str
) -> None:
    answered = _write_history(tmp_path / "written", last)
    for how in ("flip header", "flip payload"):
        data_dir = tmp_path / how.replace(" ", "-")
        shutil.copytree(tmp_path / "written", data_dir)
        _flip_newest(data_dir, how)
        checked = _pidctl("log", "verify", "--data-dir", str(data_dir))
        assert checked.returncode == 1 and "DAMAGED TAIL" in checked.stdout, checked.stdout
        _check_after_damage(data_dir, answered)


def test_a_flipped_bit_in_the_only_record_stops_start_up_clearly(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    format_data_dir(data_dir)
    assert isinstance(_newest(data_dir), ClusterCreated)
    _flip_newest(data_dir, "flip payload")
    with pytest.raises(RuntimeError, match="holds no ClusterCreated record"):
        ServerProcess(data_dir).start()
