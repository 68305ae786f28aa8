"""Storage faults, produced for real: a system call made to fail with ``strace --inject``
under load, a second process, a low file limit, an unwritable stderr. After each, the server
restarts on what is really on disk, and every acknowledged grant is checked against the log.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ops.testing.grants import Acknowledged, GrantLoad, check_data_dir
from ops.testing.serverproc import (
    FREQUENT_SNAPSHOTS,
    ServerProcess,
    connect_without_waiting,
    format_data_dir,
    strace_delay_prefix,
    strace_inject_prefix,
    strace_prefix,
    wait_until,
)
from pidctl.client import SyncClient
from pidctl.controller.core.logformat import segment_name
from pidctl.controller.core.records import ProducerIdsGranted, TransactionalIdUpdated
from pidctl.controller.log.datadir import RESERVATION_NEXT_FILE, StorageFailed
from pidctl.controller.log.recovery import read_log
from pidctl.controller.log.sync_place import QUICK_SYNCS_BEFORE_THE_LOOP
from pidctl.controller.server.app import RESERVED_FILE_DESCRIPTORS
from pidctl.protocol import requests
from pidctl.protocol.codec import decode_response, encode_request
from pidctl.protocol.framing import FrameDecoder
from tests.e2e.test_operations import http_status, scrape

pytestmark = pytest.mark.slow


def _fault_under_load(
    data_dir: Path, prefix: list[str], *extra: str, operation: str | None = None
) -> tuple[Acknowledged, int]:
    """Start the server under ``prefix``, load it until it stops; its exit status. The
    failure it reports is of ``operation``, if given."""
    server = ServerProcess(data_dir, *extra, prefix=prefix).start()
    acked = Acknowledged()
    load = GrantLoad(server.bootstrap, server.cluster_id(), acked).start()
    try:
        assert server.proc is not None
        status = server.proc.wait(60)
    finally:
        load.stop()
        server.kill()
    failed = [e for e in server.events if e.get("event") == "storage_failed"]
    assert len(failed) == 1, server.stderr_lines[-5:]
    assert failed[0]["errno"] > 0 and failed[0]["operation"] and failed[0]["file"]
    assert operation is None or failed[0]["operation"] == operation
    assert any("storage failed, stopping" in line for line in server.stderr_lines)
    _check_audit_trail(server, acked)
    return acked, status


def _check_audit_trail(server: ServerProcess, acked: Acknowledged) -> None:
    """The grant lines name only blocks the log holds (a line is written once its grant is
    durable), and every block acknowledged to a broker has its line. Blocks are granted in
    ascending order, so those below the oldest the log still holds went with segments a
    snapshot covered."""
    logged = {
        (e["first_producer_id"], e["last_producer_id"] + 1 - e["first_producer_id"])
        for e in server.events
        if e.get("event") == "producer ids granted"
    }
    in_log = {
        (r.first_producer_id, r.next_producer_id - r.first_producer_id)
        for r in (e.record for e in read_log(server.data_dir).entries())
        if isinstance(r, ProducerIdsGranted)
    }
    assert logged and in_log
    oldest = min(first for first, _ in in_log)
    assert {block for block in logged if block[0] >= oldest} <= in_log
    assert set(acked.blocks) <= logged
    holders = {e["holder"] for e in server.events if e.get("event") == "producer ids granted"}
    assert holders <= {"broker", "controller"} and "broker" in holders


def _restart_and_check(data_dir: Path, acked: Acknowledged) -> None:
    """Start again on what is on disk: every acknowledged answer is there, and new grants
    overlap none of them."""
    verdict = check_data_dir(data_dir, acked)
    assert verdict.lost == [] and verdict.handed_out_twice == []
    with ServerProcess(data_dir) as server, SyncClient(server.bootstrap) as client:
        after = Acknowledged()
        load = GrantLoad(server.bootstrap, server.cluster_id(), after).start()
        wait_until(lambda: after.count > 20, "grants after the restart")
        load.stop()
        client.request(requests.api_versions())
    merged = Acknowledged(
        acked.blocks + after.blocks,
        acked.pids + after.pids,
        acked.transactional + after.transactional,
    )
    assert check_data_dir(data_dir, merged).handed_out_twice == []


def test_failed_fdatasync_stops_the_server_and_nothing_unsynced_was_acknowledged(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "d"
    segment = data_dir / segment_name(0)
    acked, status = _fault_under_load(data_dir, strace_prefix("fdatasync", "EIO", "40", segment))
    assert status == StorageFailed.exit_code
    assert acked.count > 0
    _restart_and_check(data_dir, acked)


# Records are written with pwrite64 (where the last one ended, before the preallocated
# zeros), the zeros with pwritev2 (os.pwritev): a fault aims at one or the other.


def test_failed_write_leaves_no_hole(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    segment = data_dir / segment_name(0)
    fault = strace_prefix("pwrite64", "ENOSPC", "30", segment)
    acked, status = _fault_under_load(data_dir, fault)
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


def test_a_write_that_takes_no_byte_stops_the_server(tmp_path: Path) -> None:
    """A segment write returning 0 (never, for a regular file) is a storage failure, not a
    loop that writes for ever."""
    data_dir = tmp_path / "d"
    segment = data_dir / segment_name(0)
    zero = strace_inject_prefix("pwrite64", "retval=0", "20", segment)
    acked, status = _fault_under_load(data_dir, zero)
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


#: Small chunks of zeros, so that preallocation runs every few commits under load.
SMALL_PREALLOCATION = ("--log-preallocate-bytes", "65536")


def test_a_failed_preallocation_stops_the_server_as_a_failed_write_does(tmp_path: Path) -> None:
    """Zeros that cannot be written (EIO) mean a failing disk: fail-stop, and every
    acknowledged grant is on disk after the restart."""
    data_dir = tmp_path / "d"
    segment = data_dir / segment_name(0)
    fault = strace_prefix("pwritev2", "EIO", "3", segment)
    acked, status = _fault_under_load(
        data_dir, fault, *SMALL_PREALLOCATION, operation="preallocate"
    )
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


def test_a_full_disk_stops_preallocation_not_the_records(tmp_path: Path) -> None:
    """ENOSPC for the zeros (every time): the segment grows as it is written, as without
    preallocation, and grants go on."""
    data_dir = tmp_path / "d"
    segment = data_dir / segment_name(0)
    full = strace_prefix("pwritev2", "ENOSPC", "1+", segment)
    with ServerProcess(data_dir, *SMALL_PREALLOCATION, prefix=full) as server:
        acked = Acknowledged()
        load = GrantLoad(server.bootstrap, server.cluster_id(), acked).start()
        try:
            wait_until(lambda: acked.count > 300, "grants with preallocation refused")
        finally:
            load.stop()
        refused = [e for e in server.events if e.get("event") == "preallocation refused"]
        assert len(refused) == 1 and refused[0]["error"] == "ENOSPC"
        assert server.proc is not None and server.proc.poll() is None
    _restart_and_check(data_dir, acked)


#: One reservation, at the first grant of the faulty run (the prepared data dir's was
#: released by its clean stop), and none after it: the system calls below are counted.
ONE_RESERVATION = ("--producer-id-reservation", str(10**12))


# fsync serves rolls, snapshots and reservations only (records use fdatasync): the first
# grant's reservation takes two (its file's, the directory's), then two per roll (the new
# segment's, the directory's). 5 and 6 fail the second roll at each of them.
@pytest.mark.parametrize("when", ["5", "6"])
def test_a_roll_that_fails_half_way_leaves_a_startable_directory(tmp_path: Path, when: str) -> None:
    data_dir = tmp_path / "d"
    acked, status = _fault_under_load(
        data_dir,
        strace_prefix("fsync", "EIO", when),
        "--segment-max-bytes",
        "4000",
        *ONE_RESERVATION,
    )
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


def test_a_failed_snapshot_leaves_a_startable_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    # The first rename is the first grant's reservation, the second the roll before the
    # snapshot, the third the snapshot's own.
    acked, status = _fault_under_load(
        data_dir,
        strace_prefix("rename", "EIO", "3"),
        "--snapshot-interval-records",
        "200",
        *FREQUENT_SNAPSHOTS,
        *ONE_RESERVATION,
    )
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


def test_a_failed_reservation_stops_the_server_and_loses_nothing(tmp_path: Path) -> None:
    """Reservations of 20 blocks: the rename of the third one fails (some 40 grants in,
    the grant that needs it held back until it is on disk; counted per thread, so the
    third of the loop's or of the log's thread, and each one after it): the server stops
    with 74, and a restart loses nothing."""
    data_dir = tmp_path / "d"
    acked, status = _fault_under_load(
        data_dir,
        strace_prefix("rename", "EIO", "3+", data_dir / RESERVATION_NEXT_FILE),
        "--producer-id-reservation",
        "20000",
        operation="rename",
    )
    assert status == StorageFailed.exit_code
    _restart_and_check(data_dir, acked)


def test_a_record_replay_could_not_read_is_refused_and_nothing_written(
    server: ServerProcess,
) -> None:
    with SyncClient(server.bootstrap) as client:
        huge = client.request(requests.init_producer_id("\x01" * 175_000))
        assert (huge.error_code, huge.producer_id) == (42, -1)  # INVALID_REQUEST
        longest = client.request(requests.init_producer_id("\x01" * 32767))
        assert longest.error_code == 0
    records = [e.record for e in read_log(server.data_dir).entries()]
    updates = [r for r in records if isinstance(r, TransactionalIdUpdated)]
    assert [len(u.transactional_id) for u in updates] == [32767]
    server.kill()
    with ServerProcess(server.data_dir) as again, SyncClient(again.bootstrap) as client:
        bumped = client.request(requests.init_producer_id("\x01" * 32767))
        assert (bumped.producer_id, bumped.producer_epoch) == (longest.producer_id, 1)


def test_one_writer_per_data_dir_whatever_is_deleted(server: ServerProcess) -> None:
    for name in os.listdir(server.data_dir):
        if "lock" in name:
            os.unlink(server.data_dir / name)
    second = ServerProcess(server.data_dir)
    assert server.proc is not None
    with pytest.raises(
        RuntimeError, match=f"in use by another pidctl process \\(pid {server.proc.pid}\\)"
    ):
        second.start()
    command = [
        sys.executable,
        "-m",
        "pidctl.controller.cli",
        "import-zk",
        "--zookeeper",
        "127.0.0.1:1",
        "--data-dir",
        str(server.data_dir),
        "--timeout",
        "1",
    ]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0


def _answered_after_its_sync(server: ServerProcess, client: SyncClient, request: Any) -> Any:
    """Send ``request`` on a connection of its own, whose answer waits for a slow sync; show
    that ``client`` is answered meanwhile and that the request is not yet; then its answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as waiting:
        waiting.sendall(encode_request(request, 1, "t"))
        assert client.request(requests.api_versions()).error_code == 0
        assert select.select([waiting], [], [], 0)[0] == [], "answered before its sync"
        decoder, frames = FrameDecoder(), list[bytes]()
        while not frames:
            frames = decoder.feed(waiting.recv(65536))
    return decode_response(frames[0], request.__api_key__, request.__version__)


def test_a_slow_sync_moves_commits_off_the_event_loop_until_the_disk_is_quick_again(
    tmp_path: Path,
) -> None:
    """Each thread's first fdatasync of the segment is made 2 s slower (for real, by
    strace): the first commit, on the event loop (at start-up: a block for InitProducerId's
    pool), and the first one the log's thread runs. While that one syncs, the loop answers
    what does not wait for the disk; after 64 quick syncs in a row in the thread, commits
    are back on the loop."""
    data_dir = tmp_path / "d"
    slow = strace_delay_prefix("fdatasync", 2.0, "1", data_dir / segment_name(0))
    in_thread = "pidctl_log_commits_in_thread_total"
    request = requests.init_producer_id("slow-disk")  # durable: each one is a commit
    # Slow: 500 ms or more. The other syncs are quick by far, also under strace on a busy
    # machine (with the 10 ms default, one in 70 was not, and the count began again).
    quick_below = ("--log-inline-sync-max-ms", "500")
    with (
        ServerProcess(data_dir, *quick_below, prefix=slow) as server,
        SyncClient(server.bootstrap) as client,
    ):
        metrics = scrape(server.metrics_url)
        assert (metrics["pidctl_log_commit_batch_records_count"], metrics[in_thread]) == (1, 0)
        answer = _answered_after_its_sync(server, client, request)  # in the thread: 2 s
        assert answer.error_code == 0
        assert scrape(server.metrics_url)[in_thread] == 1
        for _ in range(70):  # in the thread until 64 in a row were quick, then on the loop
            assert client.request(request).error_code == 0
        assert scrape(server.metrics_url)[in_thread] == 1 + QUICK_SYNCS_BEFORE_THE_LOOP


def test_a_slow_prefetch_holds_up_no_answer_of_the_block_before_it(tmp_path: Path) -> None:
    """InitProducerId's pool asks for its next block at 90 % of the current one. Nobody
    waits for that grant, so its commit runs in the log's thread, and here its fdatasync
    takes 3 s longer, for real (strace; each thread's first on the segment, so the start-up
    commit's on the loop too: counted quick, so that commits stay on the loop). The
    idempotent InitProducerIds of the rest of the block are answered meanwhile; the first
    PID of the new block waits until its grant is durable."""
    data_dir = tmp_path / "d"
    slow = strace_delay_prefix("fdatasync", 3.0, "1", data_dir / segment_name(0))
    quick_below = ("--log-inline-sync-max-ms", "60000")
    request = requests.init_producer_id(None)
    with (
        ServerProcess(data_dir, *quick_below, prefix=slow) as server,
        SyncClient(server.bootstrap) as client,
    ):
        # The 901st sets the prefetch off; the 99 after it are answered before its sync ends.
        assert [client.request(request).producer_id for _ in range(1000)] == list(range(1000))
        answer = _answered_after_its_sync(server, client, request)
        assert (answer.error_code, answer.producer_id) == (0, 1000)
        assert scrape(server.metrics_url)["pidctl_log_commits_in_thread_total"] == 1


def _log_thread(pid: int) -> int:
    """The thread id of the server's log thread: its one thread besides the main one that
    trio did not start (trio names its workers; Python 3.11 names no thread of ours)."""
    ours = [
        int(task.name)
        for task in Path(f"/proc/{pid}/task").iterdir()
        if int(task.name) != pid and (task / "comm").read_text().strip() == "python"
    ]
    assert len(ours) == 1, ours
    return ours[0]


def test_a_failed_sync_in_the_log_thread_stops_the_server_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The commit nobody waits for, the pool's prefetch, runs in the log's thread: there its
    fdatasync fails, for real (strace attached to that thread alone, its first one made to
    return EIO). The server stops as for any failed sync; every PID it acknowledged is in
    the log after a restart, and none is handed out again. Every sync counts as quick, so
    that no commit an answer waits for goes to the thread first (a slow one, on a busy
    machine, would send the next ones there)."""
    data_dir = tmp_path / "d"
    server = ServerProcess(data_dir, "--log-inline-sync-max-ms", "60000").start()
    acked = Acknowledged()
    try:
        assert server.proc is not None
        tracer = subprocess.Popen(
            [
                "strace",
                "-p",
                str(_log_thread(server.proc.pid)),
                "-o",
                "/dev/null",
                "-e",
                "trace=fdatasync",
                "-e",
                "inject=fdatasync:error=EIO:when=1",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert tracer.stderr is not None
        assert "attached" in tracer.stderr.readline()  # (strace says so once it is)
        request = requests.init_producer_id(None)
        with contextlib.suppress(ConnectionError, OSError), SyncClient(server.bootstrap) as c:
            for _ in range(2000):  # (the server stops before the 1000th)
                answer = c.request(request)
                if answer.error_code:
                    break
                acked.pids.append(answer.producer_id)
        assert server.proc.wait(60) == StorageFailed.exit_code
        tracer.wait(30)
    finally:
        server.kill()
    # The prefetch at 900 failed, and the server went down: what it answered meanwhile was
    # of block 0 (the answer that set the prefetch off among them), nothing of block 1.
    assert acked.pids == list(range(len(acked.pids))) and 900 < len(acked.pids) <= 1000
    [failed] = [e for e in server.events if e.get("event") == "storage_failed"]
    assert failed["operation"] == "fdatasync"
    _restart_and_check(data_dir, acked)


def test_a_disk_slow_every_65th_sync_holds_the_event_loop_up_twice_not_for_ever(
    tmp_path: Path,
) -> None:
    """Every 65th fdatasync of the segment in each thread takes 0.8 s longer, for real (strace
    counts per thread). Commits that came back to the loop after 64 quick syncs in the
    thread would meet the next slow one there, once per 130 commits for ever; backing off
    further each time, the loop is held up by the first slow sync and the one after the
    first return, and then never again."""
    data_dir = tmp_path / "d"
    ServerProcess(data_dir).start().terminate()  # create the data dir and the cluster
    slow = strace_delay_prefix("fdatasync", 0.8, "1+65", data_dir / segment_name(0))
    request = requests.init_producer_id("slow-disk")  # durable: each one is a commit
    quick_below = ("--log-inline-sync-max-ms", "500")
    with (
        ServerProcess(data_dir, *quick_below, prefix=slow) as server,
        SyncClient(server.bootstrap) as client,
    ):
        for _ in range(600):
            assert client.request(request).error_code == 0
        samples = scrape(server.metrics_url)
    assert samples["pidctl_log_slow_commits_on_loop_total"] == 2
    assert samples["pidctl_log_commits_in_thread_total"] > 450


def test_max_connections_the_file_limit_cannot_carry_is_refused(tmp_path: Path) -> None:
    low = ["prlimit", "--nofile=256:256"]
    budget = "max_connections 1000 and metrics_max_connections 32 need 1096 file descriptors"
    with pytest.raises(RuntimeError, match=budget):
        ServerProcess(tmp_path / "d", "--max-connections", "1000", prefix=low).start()


def _under_a_file_limit(
    data_dir: Path, limit: int, clients: int, metrics: int
) -> tuple[ServerProcess, int]:
    """A server under a real RLIMIT_NOFILE of ``limit``, with ``clients`` Kafka and
    ``metrics`` HTTP connections at most, and a snapshot (with its roll) due every 40
    records: the log needs descriptors while the connections take theirs. With the
    descriptors it may hold at most (its budget, as ``raise_file_limit`` counts it)."""
    budget = clients + metrics + RESERVED_FILE_DESCRIPTORS
    server = ServerProcess(
        data_dir,
        "--max-connections",
        str(clients),
        "--metrics-max-connections",
        str(metrics),
        "--snapshot-interval-records",
        "40",
        *FREQUENT_SNAPSHOTS,
        prefix=["prlimit", f"--nofile={limit}:{limit}"],
    )
    return server, budget


class HttpFlood:
    """Connections to the metrics port that never send a byte (a scraper gone wrong), kept
    at ``connections`` open: one closed (by the server's request timeout, or by the flood
    itself, oldest first) is replaced."""

    def __init__(self, port: int, connections: int) -> None:
        self.port = port
        self.connections = connections
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> HttpFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                while len(held) < self.connections:
                    held.append(connect_without_waiting(self.port))
                    self.opened += 1
                # A few replaced each round, so the flood goes on past the server's timeout.
                for sock in held[:5]:
                    sock.close()
                del held[:5]
                self._stop.wait(0.05)
        finally:
            for sock in held:
                sock.close()


def _link(path: str) -> str:
    """Where a descriptor of /proc points; "" if it closed meanwhile."""
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return ""


def test_metrics_connections_cannot_take_the_descriptors_the_log_needs(tmp_path: Path) -> None:
    """Hundreds of HTTP connections to the metrics port under a real low RLIMIT_NOFILE,
    while grants make rolls and snapshots due: the endpoint holds at most
    metrics_max_connections (each new one closes the one waiting longest for its request),
    the server's descriptors stay within its budget, and every roll and snapshot is taken
    on time."""
    limit, clients, metrics = 200, 40, 8
    server, budget = _under_a_file_limit(tmp_path / "d", limit, clients, metrics)
    with server, SyncClient(server.bootstrap) as client:
        assert server.proc is not None
        pid = server.proc.pid

        def open_descriptors() -> int:
            return len(os.listdir(f"/proc/{pid}/fd"))

        def open_sockets() -> int:  # (not the log's files, which come and go)
            return sum(
                _link(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                for fd in os.listdir(f"/proc/{pid}/fd")
            )

        before = open_sockets()
        descriptors: list[int] = []
        with HttpFlood(server.metrics_port, 3 * limit) as flood:
            wait_until(lambda: flood.opened >= 3 * limit, "the flood's connections")
            wait_until(lambda: open_sockets() >= before + metrics, "the endpoint full")
            for _ in range(240):  # six snapshots due, each with its roll
                assert client.request(requests.allocate(-1, -1)).error_code == 0
                descriptors.append(open_descriptors())
                time.sleep(0.02)  # pacing the load, not waiting for anything
            wait_until(
                lambda: sum(e.get("event") == "snapshot written" for e in server.events) >= 5,
                "the snapshots due",
            )
            assert server.proc.poll() is None
        assert max(descriptors) <= budget, (max(descriptors), budget)
        postponed = [e for e in server.events if "postponed" in str(e.get("event"))]
        assert postponed == []
        assert not [e for e in server.events if e.get("event") == "storage_failed"]
        wait_until(lambda: http_status(server.metrics_url + "/readyz") == 200, "ready after it")
        samples = scrape(server.metrics_url)
        assert samples['pidctl_http_connections_evicted_total{reason="full"}'] > 0
        assert samples["pidctl_http_connections"] <= metrics


def test_refused_connections_cannot_take_the_descriptors_the_log_needs(tmp_path: Path) -> None:
    """Bursts of connections over max_connections under a real low RLIMIT_NOFILE, while
    grants make rolls and snapshots due: a refused connection is closed before the next
    accept (not in a task of its own, up to a batch of accepts later), so the server's
    descriptors stay within its budget and nothing of the log is postponed."""
    limit, clients, metrics = 200, 40, 4
    server, budget = _under_a_file_limit(tmp_path / "d", limit, clients, metrics)
    with server, SyncClient(server.bootstrap) as client:
        assert server.proc is not None
        pid = server.proc.pid
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(clients - 1)]
        wait_until(
            lambda: scrape(server.metrics_url)["pidctl_connections"] == clients, "all admitted"
        )
        descriptors: list[int] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                with contextlib.suppress(FileNotFoundError):
                    descriptors.append(len(os.listdir(f"/proc/{pid}/fd")))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(5):
                burst = [connect_without_waiting(server.port) for _ in range(500)]
                for _ in range(48):  # a snapshot due, with its roll
                    assert client.request(requests.allocate(-1, -1)).error_code == 0
                for sock in burst:
                    sock.close()
        finally:
            sampling.set()
            sampler.join(30)
            for sock in held:
                sock.close()
        refused = scrape(server.metrics_url)[
            'pidctl_connections_closed_total{reason="max_connections"}'
        ]
        assert refused > 0
        assert server.proc.poll() is None
    assert max(descriptors) <= budget, (max(descriptors), budget)
    troubles = [e for e in server.events if e.get("level") == "error" or "postponed" in str(e)]
    assert troubles == []


def test_running_out_of_file_descriptors_postpones_a_roll_and_keeps_serving(
    tmp_path: Path,
) -> None:
    server = ServerProcess(
        tmp_path / "d",
        "--segment-max-bytes",
        "2000",
        "--snapshot-interval-records",
        "50",
        *FREQUENT_SNAPSHOTS,
    )
    with server, SyncClient(server.bootstrap) as client:
        assert server.proc is not None
        pid = server.proc.pid
        epoch = int(client.request(requests.registration(9, server.cluster_id())).broker_epoch)

        def allocate(times: int) -> None:
            for _ in range(times):
                assert client.request(requests.allocate(9, epoch)).error_code == 0

        def set_open_files(soft: int) -> None:
            subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:"], check=True)

        hard = int(Path(f"/proc/{pid}/limits").read_text().split("Max open files")[1].split()[1])
        # Exactly as many descriptors as are open now: the next open fails with EMFILE.
        set_open_files(len(os.listdir(f"/proc/{pid}/fd")))
        segments = len(list(server.data_dir.glob("*.log")))
        allocate(60)  # well past segment_max_bytes: a roll is due, and cannot open a file
        wait_until(
            lambda: any(e.get("event") == "segment roll postponed" for e in server.events),
            "a postponed roll",
        )
        assert len(list(server.data_dir.glob("*.log"))) == segments
        # A new client meanwhile: accept fails (EMFILE) and is retried, not fatal.
        late: list[int] = []
        newcomer = SyncClient(server.bootstrap)
        asking = threading.Thread(
            target=lambda: late.append(newcomer.request(requests.api_versions()).error_code)
        )
        asking.start()
        wait_until(
            lambda: any(e.get("event") == "accept failed; retrying" for e in server.events),
            "a refused accept",
        )
        set_open_files(hard)
        asking.join(30)
        newcomer.close()
        assert late == [0]
        allocate(40)
        assert len(list(server.data_dir.glob("*.log"))) > segments  # rolled once it could
        # The snapshot due meanwhile (a roll first) was postponed too, and taken once it could.
        wait_until(
            lambda: any(e.get("event") == "snapshot written" for e in server.events),
            "the snapshot after the limit was raised",
        )
        assert server.proc.poll() is None
    verdict = check_data_dir(server.data_dir, Acknowledged())
    assert verdict.lost == []


def test_an_unwritable_stderr_does_not_stop_the_server(tmp_path: Path) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    format_data_dir(tmp_path / "d")
    command = [
        sys.executable,
        "-m",
        "pidctl.controller.cli",
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        "--listen",
        f"127.0.0.1:{ports[0]}",
        "--metrics-listen",
        f"127.0.0.1:{ports[1]}",
    ]
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        proc = subprocess.Popen(command, stdout=full, stderr=full)
    try:

        def served() -> bool:
            try:
                with SyncClient(f"127.0.0.1:{ports[0]}", timeout=2) as client:
                    return bool(client.request(requests.init_producer_id()).error_code == 0)
            except OSError:
                return False

        wait_until(served, "an answer with every log line failing")
        failures = scrape(f"http://127.0.0.1:{ports[1]}")["pidctl_log_write_failures_total"]
        assert failures > 0
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
