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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.bench.common import first_overlap
from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.controller.core.logformat import SEGMENT_SUFFIX
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.datadir import RESERVATION_FILE
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
