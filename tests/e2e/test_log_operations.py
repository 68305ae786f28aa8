"""The log as an operator meets it, each case produced for real: `pidctl log dump` and `verify`
on a data dir a loaded server is rolling and snapshotting; the audit trail kept by default
after snapshots; errors that name the file and the operation (EIO on the stat of a new
snapshot, on the truncation of a torn tail; a deleted snapshot); a full ext4 file system (a
loop-mounted image); a producer-id range used up."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.grants import Acknowledged, GrantLoad
from ops.testing.serverproc import (
    FREQUENT_SNAPSHOTS,
    ServerProcess,
    format_data_dir,
    strace_inject_prefix,
    strace_prefix,
    wait_until,
)
from pidctl.client import SyncClient
from pidctl.controller.core.logformat import SNAPSHOT_SUFFIX, segment_name, snapshot_name
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.recovery import read_log
from pidctl.controller.log.space import free_bytes
from pidctl.protocol import requests
from tests.e2e.test_operations import scrape

pytestmark = pytest.mark.slow


def _pidctl(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pidctl.controller.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


#: Rolls and snapshots all the time, and nothing kept below a snapshot: what makes a live
#: read race with the server.
CHURN = ("--snapshot-interval-records", "20", *FREQUENT_SNAPSHOTS, "--segment-max-bytes", "3000")
DELETE_COVERED = ("--log-retention-bytes", "0", "--log-retention-ms", "0")
#: Each of `log verify` and `log dump`, run this often while the server churns (each run
#: reads the whole data dir, through a few of the server's rolls and snapshots).
READS = 10


def test_dump_and_verify_are_safe_while_the_server_rolls_and_snapshots(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d", *CHURN, *DELETE_COVERED)
    with server:
        acked = Acknowledged()
        load = GrantLoad(server.bootstrap, server.cluster_id(), acked).start()
        try:
            results = []
            for _ in range(READS):
                results.append(
                    ("verify", _pidctl("log", "verify", "--data-dir", str(server.data_dir)))
                )
                results.append(("dump", _pidctl("log", "dump", "--data-dir", str(server.data_dir))))
            snapshots = sum(e.get("event") == "snapshot written" for e in server.events)
        finally:
            load.stop()
    assert snapshots > READS, "the server should have snapshotted (and deleted) all along"
    for command, result in results:
        said = result.stdout + result.stderr
        assert "Traceback" not in said and "CORRUPT" not in said, (command, said[-2000:])
        # A write caught half done at the very end is the only thing a live read may see.
        assert result.returncode == 0 or "DAMAGED TAIL" in result.stdout, (command, said)
    assert sum(result.returncode == 0 for _, result in results) > len(results) // 2


def _snapshotted(server: ServerProcess) -> bool:
    return any(e.get("event") == "snapshot written" for e in server.events)


def _grants_until_a_snapshot(server: ServerProcess, grants: int = 60) -> None:
    with SyncClient(server.bootstrap) as client:
        for _ in range(grants):
            assert client.request(requests.allocate(-1, -1)).error_code == 0
    wait_until(lambda: _snapshotted(server), "a snapshot")


def test_the_audit_trail_is_kept_after_snapshots_by_default(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d", *CHURN) as server:
        _grants_until_a_snapshot(server)
    assert any(p.suffix == SNAPSHOT_SUFFIX for p in server.data_dir.iterdir())
    dump = _pidctl("log", "dump", "--data-dir", str(server.data_dir), "--json")
    records = [json.loads(line) for line in dump.stdout.splitlines()]
    assert dump.returncode == 0 and records[0]["offset"] == 0  # the whole history
    assert "removed" not in dump.stderr
    # With no audit trail (no floor in time, nothing older in bytes), the dump and verify
    # say what is gone.
    data_dir = tmp_path / "no-trail"
    with ServerProcess(data_dir, *CHURN, *DELETE_COVERED) as server:
        _grants_until_a_snapshot(server)
    text = _pidctl("log", "dump", "--data-dir", str(data_dir))
    notes = [line for line in text.stdout.splitlines() if line.startswith("# records")]
    assert len(notes) == 1 and "were removed" in notes[0], text.stdout[:500]
    as_json = _pidctl("log", "dump", "--data-dir", str(data_dir), "--json")
    assert "were removed" in as_json.stderr  # stdout stays JSON lines
    assert all(line.startswith("{") for line in as_json.stdout.splitlines())
    verify = _pidctl("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0 and "were removed" in verify.stdout


def test_eio_on_the_stat_of_a_new_snapshot_stops_with_storage_failed(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    format_data_dir(data_dir)
    # Every stat of each file a first snapshot may be written as (whatever call libc makes).
    candidates = [data_dir / snapshot_name(offset) for offset in range(15, 90)]
    fail_stat = strace_inject_prefix("newfstatat,statx,stat,lstat", "error=EIO", None, candidates)
    server = ServerProcess(
        data_dir, "--snapshot-interval-records", "20", *FREQUENT_SNAPSHOTS, prefix=fail_stat
    )
    server.start()
    try:
        with SyncClient(server.bootstrap) as client:
            try:
                for _ in range(60):
                    client.request(requests.allocate(-1, -1))
            except (ConnectionError, OSError):
                pass  # the server stopped under it
        assert server.proc is not None
        assert server.proc.wait(60) == StorageFailed.exit_code
    finally:
        server.kill()
    failed = [e for e in server.events if e.get("event") == "storage_failed"]
    assert len(failed) == 1, server.stderr_lines[-5:]
    assert failed[0]["operation"] == "stat" and failed[0]["error"] == "EIO"
    assert failed[0]["file"].endswith(SNAPSHOT_SUFFIX)
    assert any("storage failed, stopping: stat of" in line for line in server.stderr_lines)
    # What is on disk starts again.
    with ServerProcess(data_dir) as again, SyncClient(again.bootstrap) as client:
        assert client.request(requests.allocate(-1, -1)).error_code == 0


def test_an_io_error_truncating_a_torn_tail_names_the_file_and_the_operation(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "d"
    with ServerProcess(data_dir) as server, SyncClient(server.bootstrap) as client:
        assert client.request(requests.allocate(-1, -1)).error_code == 0
        assert server.terminate() == 0  # a clean stop: the segment ends at its last record
    segment = data_dir / segment_name(0)
    segment.write_bytes(segment.read_bytes() + b"\x00\x00\x01")  # a torn tail to truncate
    fail = strace_prefix("ftruncate", "EIO", "1", segment)
    broken = ServerProcess(data_dir, prefix=fail)
    with pytest.raises(RuntimeError, match=f"exited with {StorageFailed.exit_code}"):
        broken.start()
    failed = [e for e in broken.events if e.get("event") == "storage_failed"]
    assert failed and failed[0]["operation"] == "ftruncate"
    assert failed[0]["file"] == str(segment) and failed[0]["error"] == "EIO"
    assert any(f"ftruncate of {segment} failed" in line for line in broken.stderr_lines)
    with ServerProcess(data_dir) as server:  # without the fault: truncated, serving
        assert server.event("truncating torn tail")["bytes"] == 3


def test_a_deleted_snapshot_is_named_not_an_invariant(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    with ServerProcess(data_dir, *CHURN, *DELETE_COVERED) as server:
        _grants_until_a_snapshot(server)
    for snapshot in data_dir.glob("*" + SNAPSHOT_SUFFIX):
        snapshot.unlink()
    said = r"the log starts at offset \d+ \(\d{20}\.log\) and no snapshot holds the records"
    with pytest.raises(RuntimeError, match=said):
        ServerProcess(data_dir).start()
    verify = _pidctl("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 1 and re.search(said, verify.stdout), verify.stdout
    assert "invariant" not in verify.stdout


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB ext4 file system on a loop device (needs root, as the CI machines run)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.fail("a loop-mounted ext4 needs root and mkfs.ext4 (e2fsprogs)")
    image, mount = tmp_path / "ext4.img", tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _fill(directory: Path, leave: int = 0) -> Path:
    """Write a file until the file system has ``leave`` bytes left for a user (or says
    ENOSPC); the file."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while (room := free_bytes(directory) - leave) > 0:
                f.write(b"\0" * min(room, 65536))
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass
    return filler


#: The room the tests ask of the 8 MiB file system.
ROOM = 1_000_000
#: What a paused server answers: AllocateProducerIds, InitProducerId.
KAFKA_STORAGE_ERROR = 56
COORDINATOR_LOAD_IN_PROGRESS = 14


def _readyz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_full_ext4_file_system_is_refused_at_start_up(small_ext4: Path) -> None:
    data_dir = small_ext4 / "d"
    room = ("--data-dir-min-free-bytes", str(ROOM))
    acked: list[tuple[int, int]] = []
    with ServerProcess(data_dir, *room) as server, SyncClient(server.bootstrap) as client:
        for _ in range(20):
            block = client.request(requests.allocate(-1, -1))
            acked.append((block.producer_id_start, block.producer_id_len))
    filler = _fill(small_ext4)
    refused = ServerProcess(data_dir, *room)
    said = r"(?s)exited with 1: .*pidctl: data dir .* free on the data dir.s filesystem, below"
    with pytest.raises(RuntimeError, match=said):
        refused.start()
    assert not any(e.get("event") == "listening" for e in refused.events)  # never ready
    filler.unlink()
    with ServerProcess(data_dir, *room) as server, SyncClient(server.bootstrap) as client:
        after = client.request(requests.allocate(-1, -1))
        assert after.error_code == 0 and after.producer_id_start >= acked[-1][0] + 1000
    granted = {
        (e.record.first_producer_id, e.record.next_producer_id - e.record.first_producer_id)
        for e in read_log(data_dir).entries()
        if isinstance(e.record, ProducerIdsGranted)
    }
    assert set(acked) <= granted  # nothing acknowledged was lost


def test_a_file_system_filling_up_pauses_grants_before_a_commit_fails(small_ext4: Path) -> None:
    """Below data_dir_min_free_bytes only /readyz failed: grants went on until a commit met
    ENOSPC, which stops the server. Now, under a steady load, grants pause (retriable
    errors, nothing written) while there is still room to commit, the server says so
    (/readyz, the gauges, an error line), and they resume once there is room again;
    every grant acknowledged is in the log."""
    room = ("--data-dir-min-free-bytes", str(ROOM))
    acked: list[tuple[int, int]] = []
    with ServerProcess(small_ext4 / "d", *room) as server, SyncClient(server.bootstrap) as client:
        assert _readyz(server.metrics_url)[0] == 200
        filler = _fill(small_ext4, leave=ROOM // 4)
        load = [requests.allocate(-1, -1)] * 50 + [requests.init_producer_id()] * 10
        deadline = time.monotonic() + 60
        while True:  # ~1,000 grants a second, the records ~100 KB a second
            answers = client.pipeline(load)
            acked += [
                (a.producer_id_start, a.producer_id_len) for a in answers[:50] if a.error_code == 0
            ]
            errors = {int(a.error_code) for a in answers}
            if errors == {KAFKA_STORAGE_ERROR, COORDINATOR_LOAD_IN_PROGRESS}:
                break  # paused
            assert errors <= {0, KAFKA_STORAGE_ERROR, COORDINATOR_LOAD_IN_PROGRESS}, errors
            assert time.monotonic() < deadline, "grants never paused"
            time.sleep(0.05)  # pacing the load, not waiting for anything
        assert server.proc is not None and server.proc.poll() is None
        status, reasons = _readyz(server.metrics_url)
        assert status == 503 and "disk_space: " in reasons
        assert "below data_dir_min_free_bytes" in reasons
        samples = scrape(server.metrics_url)
        assert samples["pidctl_data_dir_free_bytes"] < ROOM
        assert samples["pidctl_grants_paused"] == 1
        refused = 'pidctl_producer_id_refusals_total{api="AllocateProducerIds",reason="disk_space"}'
        assert samples[refused] >= 50
        filler.unlink()

        def resumed() -> bool:
            answer = client.request(requests.allocate(-1, -1))
            if answer.error_code:
                return False
            acked.append((answer.producer_id_start, answer.producer_id_len))
            return True

        wait_until(resumed, "grants resumed", timeout=60)
        assert client.request(requests.init_producer_id()).error_code == 0
        wait_until(lambda: _readyz(server.metrics_url)[0] == 200, "/readyz back", timeout=60)
        assert scrape(server.metrics_url)["pidctl_grants_paused"] == 0
        assert server.terminate() == 0
    assert not [e for e in server.events if e.get("event") == "storage_failed"]
    alarms = [e for e in server.events if e.get("event") == "data dir nearly full"]
    assert len(alarms) == 1 and alarms[0]["level"] == "error", alarms
    assert "paused" in alarms[0]["grants"]
    assert any(e.get("event") == "data dir nearly full: over" for e in server.events)
    granted = {
        (e.record.first_producer_id, e.record.next_producer_id - e.record.first_producer_id)
        for e in read_log(small_ext4 / "d").entries()
        if isinstance(e.record, ProducerIdsGranted)
    }
    assert set(acked) <= granted  # every grant acknowledged is durable


def test_a_used_up_range_fails_readyz_counts_and_logs_each_refusal_rate_limited(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "d", "--last-producer-id", "2999")  # three blocks
    with server, SyncClient(server.bootstrap) as client:
        assert _readyz(server.metrics_url)[0] == 200
        started = time.monotonic()
        answers = [client.request(requests.allocate(-1, -1)).error_code for _ in range(104)]
        # Then the InitProducerId pool: its block (if any) used up, then refused.
        inits = [client.request(requests.init_producer_id()).error_code for _ in range(1001)]
        elapsed = time.monotonic() - started
        samples = scrape(server.metrics_url)
        status, reasons = _readyz(server.metrics_url)
    granted = answers.count(0)
    unknown_server_error = -1  # what Kafka's controller answers when the range is used up
    assert granted in (2, 3) and answers[granted:] == [unknown_server_error] * (104 - granted)
    assert inits[-1] == 14  # COORDINATOR_LOAD_IN_PROGRESS: clients retry it for ever
    assert status == 503
    assert "producer_ids: the producer id range is used up" in reasons
    assert "below last_producer_id 2999" in reasons
    refusals = "pidctl_producer_id_refusals_total"
    refused = samples[f'{refusals}{{api="AllocateProducerIds",reason="exhausted"}}']
    assert refused == 104 - granted
    assert samples[f'{refusals}{{api="InitProducerId",reason="exhausted"}}'] >= 1
    lines = [e for e in server.events if e.get("event") == "no producer id left"]
    assert lines and lines[0]["level"] == "error"
    assert len(lines) <= 2 + elapsed / 10  # one line per 10 s at most, each with its count
    assert sum(line["times"] for line in lines) <= refused + inits.count(14)


def test_a_range_used_up_before_start_up_fails_readyz_from_the_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    one_block = ("--last-producer-id", "999")
    with ServerProcess(data_dir, *one_block) as server, SyncClient(server.bootstrap) as client:
        assert client.request(requests.allocate(-1, -1)).error_code == 0
    with ServerProcess(data_dir, *one_block) as server:
        status, reasons = _readyz(server.metrics_url)
        assert status == 503 and "producer_ids: the producer id range is used up" in reasons
    assert server.event("no producer id left")["refused"] == "start-up"
