"""Quotas over the wire: throttle_time_ms in the answer, then a muted connection (KIP-219),
whatever the client does with the field; delayed connections over the creation rate."""

from __future__ import annotations

import datetime
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests import wire
from tests.e2e.test_hostile import sasl_plaintext_server
from tests.e2e.test_operations import scrape


def test_allocate_quota_throttles_and_mutes_the_connection(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "d", "--allocate-producer-ids-quota", "5", "--quota-window-ms", "1000"
    )
    with server, SyncClient(server.bootstrap, client_id="greedy") as client:
        epoch = wire.register(client, 1, server.cluster_id())
        started = time.monotonic()
        # The client ignores throttle_time_ms and pipelines everything at once.
        responses = client.pipeline([wire.allocate(1, epoch)] * 10)
        elapsed = time.monotonic() - started
        with SyncClient(server.bootstrap, client_id="polite") as other:
            polite = other.request(wire.allocate(1, epoch))
        metrics = scrape(server.metrics_url)
    throttles = [r.throttle_time / datetime.timedelta(milliseconds=1) for r in responses]
    assert all(r.error_code == 0 for r in responses)  # throttled, still answered
    assert throttles[:5] == [0] * 5
    assert all(t > 0 for t in throttles[5:])
    # Muted: after each throttled answer the server read nothing more from the connection
    # for that long, so every answer after it came that much later (the last one's mute
    # follows the last answer).
    assert elapsed >= 0.95 * sum(throttles[5:-1]) / 1000 >= 0.7
    # Quotas are per (principal, client id): another client id is not held back (not
    # throttled, so not muted: the server counts only greedy's five).
    assert polite.throttle_time == datetime.timedelta(0)
    assert metrics['pidctl_throttled_requests_total{api="allocate_producer_ids"}'] == 5
    assert metrics['pidctl_throttle_seconds_total{api="allocate_producer_ids"}'] > 0.8


def test_init_producer_id_quota(tmp_path: Path) -> None:
    rate = 100
    server = ServerProcess(tmp_path / "d", "--init-producer-id-quota", str(rate))
    with server, SyncClient(server.bootstrap) as client:
        started = time.monotonic()
        responses = client.pipeline([requests.init_producer_id()] * 150)
        elapsed = time.monotonic() - started
        metrics = scrape(server.metrics_url)
    throttled = [r.throttle_time > datetime.timedelta(0) for r in responses]
    assert not any(throttled[:100])  # the burst: rate x 1 s window
    # After it, the bucket refills at `rate` per second, and every answer the refill did not
    # pay for is throttled: however slow the machine, no more were let through than the
    # time the whole pipeline took can have refilled (one whole token of slack).
    let_through = throttled[100:].count(False)
    assert let_through <= rate * elapsed + 1, (let_through, elapsed)
    assert metrics['pidctl_throttled_requests_total{api="init_producer_id"}'] == sum(throttled)
    assert all(r.error_code == 0 for r in responses)


def test_connection_creation_rate_delays_new_connections(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d", "--connection-creation-rate", "4")
    with server:
        started = time.monotonic()
        for _ in range(8):
            with SyncClient(server.bootstrap) as client:
                client.request(requests.api_versions())
        elapsed = time.monotonic() - started
        metrics = scrape(server.metrics_url)
    assert elapsed >= 0.9  # 4 in the burst, then one every 250 ms
    assert metrics['pidctl_throttled_requests_total{api="connection"}'] >= 4


def test_quota_override_for_one_client_id(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text('[[quota_overrides]]\nclient_id = "batch-job"\ninit_producer_id_quota = 2\n')
    server = ServerProcess(tmp_path / "d", "--config", str(config))
    with server:
        with SyncClient(server.bootstrap, client_id="batch-job") as limited:
            slow = limited.pipeline([requests.init_producer_id()] * 4)
        with SyncClient(server.bootstrap, client_id="web") as free:
            fast = free.pipeline([requests.init_producer_id()] * 50)
    assert [r.throttle_time > datetime.timedelta(0) for r in slow] == [False, False, True, True]
    assert not any(r.throttle_time > datetime.timedelta(0) for r in fast)


def test_new_producer_ids_quota_per_principal(tmp_path: Path) -> None:
    rate = 10
    server = ServerProcess(tmp_path / "d", "--producer-ids-rate", str(rate))
    with server, SyncClient(server.bootstrap) as client:
        # Re-initialising one transactional id bumps its epoch and creates no producer id:
        # only the first use counts.
        bumps = client.pipeline([requests.init_producer_id("tx")] * 30)
        assert [r.producer_epoch for r in bumps] == list(range(30))
        assert all(r.throttle_time == datetime.timedelta(0) for r in bumps)
        started = time.monotonic()
        responses = client.pipeline([requests.init_producer_id()] * 40)
        elapsed = time.monotonic() - started
        metrics = scrape(server.metrics_url)
    assert all(r.error_code == 0 for r in responses)  # throttled, still answered
    throttles = [r.throttle_time / datetime.timedelta(milliseconds=1) for r in responses]
    throttled = [t > 0 for t in throttles]
    # The burst (rate x 1 s window) less the transactional id's one, then the refill.
    assert not any(throttled[: rate - 1])
    let_through = throttled[rate - 1 :].count(False)
    assert let_through <= rate * elapsed + 1, (let_through, elapsed)
    # Muted after each throttled answer, for that long, whatever the client does with it.
    assert elapsed >= 0.9 * sum(throttles[:-1]) / 1000
    principal = 'principal="User:ANONYMOUS"'
    assert metrics[f"pidctl_producer_ids_created_total{{{principal}}}"] == 41
    assert metrics[f"pidctl_producer_ids_throttled_total{{{principal}}}"] == sum(throttled)
    assert metrics[f"pidctl_producer_ids_throttle_seconds_total{{{principal}}}"] > 0


# -- quotas no client can evade: every connection, client id and job key counted ----------

_MS = datetime.timedelta(milliseconds=1)
THROTTLING_QUOTA_EXCEEDED = 89
COORDINATOR_LOAD_IN_PROGRESS = 14
ANONYMOUS = 'principal="User:ANONYMOUS"'


def _one_request_per_connection(
    server: ServerProcess,
    request: Any,
    seconds: float,
    client_ids: Callable[[int], str] = lambda n: "pidctl",
) -> list[Any]:
    """A client that ignores every throttle: a new connection (and client id) for each
    request, as fast as it can, for ``seconds``; the answers. Each connection is reset
    when done (SO_LINGER 0), not closed: thousands of closes would leave as many local
    ports in TIME_WAIT, and the machine's other tests short of ports."""
    answers: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with SyncClient(server.bootstrap, client_id=client_ids(len(answers))) as client:
            answers.append(client.request(request))
            _reset_on_close(client)
    return answers


def _reset_on_close(client: SyncClient) -> None:
    """SO_LINGER on, 0 s: the client's close() resets the connection (no TIME_WAIT)."""
    client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_new_connection_per_request_gets_no_more_new_producer_ids_than_the_quota(
    tmp_path: Path,
) -> None:
    """With producer_ids_rate 10/s, a client ignoring throttles by opening a new connection
    (with a new client id) per request got 443-562 PIDs a second: each answer went out at
    once, only the connection was muted. Now the principal's bucket is consulted whatever
    the connection: once it is behind, InitProducerId is refused (retriably) undecided."""
    rate, seconds = 10, 3.0
    server = ServerProcess(tmp_path / "d", "--producer-ids-rate", str(rate))
    with server:
        started = time.monotonic()
        answers = _one_request_per_connection(
            server, requests.init_producer_id(), seconds, lambda n: f"evader-{n}"
        )
        elapsed = time.monotonic() - started
        metrics = scrape(server.metrics_url)
    granted = [a for a in answers if a.error_code == 0]
    refused = [a for a in answers if a.error_code != 0]
    assert len(answers) > 3 * len(granted)  # it asked far more often than it got
    # The quota, one window's burst and one request beyond it: nothing more.
    assert len(granted) <= rate * elapsed + rate + 1, (len(granted), elapsed)
    assert {a.error_code for a in refused} == {COORDINATOR_LOAD_IN_PROGRESS}
    assert all(0 < a.throttle_time / _MS <= 1000 / rate for a in refused)
    assert metrics[f"pidctl_producer_ids_created_total{{{ANONYMOUS}}}"] == len(granted)
    assert metrics['pidctl_quota_refusals_total{api="init_producer_id"}'] == len(refused)


def test_an_honest_client_beside_an_evader_of_its_principal_waits_at_most_one_request(
    tmp_path: Path,
) -> None:
    """The principal's deficit had no floor: beside an evader, an honest client of the same
    principal from another address was told throttle_time_ms 100 s, and its next request
    was not answered within 20 s. Refused requests are not counted, so the deficit stays
    within one request: the honest client, waiting as told, is answered at once each time,
    never told to wait longer than a window, and gets producer ids."""
    rate = 10
    server = ServerProcess(tmp_path / "d", "--producer-ids-rate", str(rate))
    with server:
        stop = threading.Event()

        def evade() -> None:
            while not stop.is_set():
                with SyncClient(server.bootstrap) as client:
                    client.request(requests.init_producer_id())
                    _reset_on_close(client)

        evaders = [threading.Thread(target=evade) for _ in range(2)]
        for evader in evaders:
            evader.start()
        try:
            waits, throttles, granted = [], [], 0
            with SyncClient(server.bootstrap, source_address=("127.0.0.2", 0)) as honest:
                deadline = time.monotonic() + 4.0
                while time.monotonic() < deadline:
                    sent = time.monotonic()
                    answer = honest.request(requests.init_producer_id())
                    waits.append(time.monotonic() - sent)
                    throttles.append(answer.throttle_time / _MS)
                    granted += answer.error_code == 0
                    time.sleep(answer.throttle_time / _MS / 1000)  # as it is told
        finally:
            stop.set()
            for evader in evaders:
                evader.join()
    assert max(throttles) <= 1000  # at most one window (here one request: 100 ms)
    assert max(waits) < 1.0, max(waits)  # answered at once, refused or granted
    assert granted > 0


#: A client of its own process (no GIL shared with the measuring one) that ignores every
#: throttle: a new SASL connection per InitProducerId, reset when done, until killed.
_ABUSER = """
import socket, struct, sys
from pidctl.client import SyncClient
from pidctl.protocol import requests
bootstrap, user = sys.argv[1], sys.argv[2]
while True:
    try:
        with SyncClient(bootstrap, sasl=("PLAIN", user, user + "-pw")) as client:
            client.request(requests.init_producer_id())
            client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (ConnectionError, OSError):
        pass
"""


def _honest_latencies(server: ServerProcess, count: int) -> list[float]:
    """``count`` InitProducerIds of alice, one at a time on one new connection, each after
    the throttle it was told (so never refused); the seconds each took to be answered."""
    waits = []
    with SyncClient(server.bootstrap, sasl=("PLAIN", "alice", "alice-pw")) as honest:
        for _ in range(count):
            sent = time.monotonic()
            answer = honest.request(requests.init_producer_id())
            waits.append(time.monotonic() - sent)
            assert answer.error_code == 0
            time.sleep(max(answer.throttle_time / _MS / 1000, 0.02))
    return sorted(waits)


def _p99(sorted_waits: list[float]) -> float:
    return sorted_waits[int(len(sorted_waits) * 0.99) - 1]


def test_an_honest_principal_beside_an_abuser_of_its_address_keeps_its_latency(
    tmp_path: Path,
) -> None:
    """Closed-by-the-client muted connections of an abuser held max_connections_per_address,
    and every client of that address was refused, whatever its principal. With the abuser
    (mallory, producer_ids_rate 10/s, a new connection per request) on the same address,
    an honest principal (alice) connects and keeps its p99 within a bound of its own
    baseline, measured alone in the same run."""
    server = sasl_plaintext_server(tmp_path, "alice", "mallory")
    server.extra += ["--producer-ids-rate", "10", "--max-connections-per-address", "50"]
    with server:
        baseline = _honest_latencies(server, 50)
        abuser = subprocess.Popen(
            [sys.executable, "-c", _ABUSER, server.bootstrap, "mallory"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            mallory = 'pidctl_producer_ids_created_total{principal="User:mallory"}'
            wait_until(
                lambda: scrape(server.metrics_url).get(mallory, 0) > 15,
                "the abuser past its burst",
            )
            time.sleep(1.0)  # (abusing a while longer: not waiting for anything)
            beside = _honest_latencies(server, 50)
            metrics = scrape(server.metrics_url)
        finally:
            abuser.kill()
            abuser.wait()
    # Its usual latency: a busy 2-core machine serving the abuser's connections meanwhile
    # may add a few scheduler slices, never a throttle or a wait for a slot.
    assert _p99(beside) < _p99(baseline) + 0.05, (_p99(baseline), _p99(beside))
    assert metrics['pidctl_quota_refusals_total{api="init_producer_id"}'] > 100
    assert metrics['pidctl_producer_ids_created_total{principal="User:alice"}'] == 100


def test_a_muted_connection_whose_client_hung_up_frees_its_place_at_once(
    tmp_path: Path,
) -> None:
    """A closed-by-the-client connection stayed muted for its whole throttle (up to 100 s),
    holding max_connections_per_address: every client of that address was refused. Now the
    mute ends when the client hangs up."""
    server = ServerProcess(
        tmp_path / "d",
        "--init-producer-id-quota",
        "0.01",  # a burst of 1, then 100 s a request
        "--max-connections-per-address",
        "1",
    )
    with server:
        with SyncClient(server.bootstrap) as greedy:
            first, second = greedy.pipeline([requests.init_producer_id()] * 2)
        assert first.throttle_time == datetime.timedelta(0)
        assert second.throttle_time / _MS > 90_000  # muted for it, then the client left
        started = time.monotonic()
        answer = None
        while answer is None:  # (the server sees the hang-up a moment after the close)
            try:
                with SyncClient(server.bootstrap) as next_client:
                    answer = next_client.request(requests.init_producer_id())
            except ConnectionError:
                assert time.monotonic() - started < 10, "the muted connection kept its place"
        # Served, and told that the quota is used up (as the muted one would have been).
        assert answer.error_code == COORDINATOR_LOAD_IN_PROGRESS
        assert answer.throttle_time / _MS > 80_000
        metrics = scrape(server.metrics_url)
    assert metrics['pidctl_connections_closed_total{reason="client"}'] >= 1


def test_job_blocks_count_against_the_new_producer_id_quota(tmp_path: Path) -> None:
    """A job's blocks (AllocateProducerIds with BrokerId -1, BrokerEpoch -1) were not
    counted: one client got 8,192,000 PIDs in 5 s with throttle 0, and
    pidctl_producer_ids_created_total did not move. Now each new block counts 1,000 against
    producer_ids_rate, by any mix of connections, client ids and job keys; a block answered
    again to a re-run creates nothing and is not counted."""
    rate, seconds = 1000, 3.0
    server = ServerProcess(tmp_path / "d", "--producer-ids-rate", str(rate))

    def mixed(n: int) -> str:  # unnamed jobs, named ones, every block a new name
        return f"spark-app-{n}" if n % 2 else f"pidctl-job/{n}/0/app-{n}"

    with server:
        started = time.monotonic()
        answers = _one_request_per_connection(server, wire.allocate(-1, -1), seconds, mixed)
        elapsed = time.monotonic() - started
        metrics = scrape(server.metrics_url)
        # A re-run asking a recorded block again (retrying as told while the principal's
        # bucket is behind) is answered the same block, and counts nothing: it creates no
        # producer id.
        recorded = next(
            n for n, a in enumerate(answers) if a.error_code == 0 and mixed(n).startswith("pid")
        )
        with SyncClient(server.bootstrap, client_id=mixed(recorded)) as rerun:
            again = rerun.request(wire.allocate(-1, -1))
            while again.error_code == THROTTLING_QUOTA_EXCEEDED:
                assert time.monotonic() - started < seconds + 10
                time.sleep(again.throttle_time / _MS / 1000)
                again = rerun.request(wire.allocate(-1, -1))
            after = scrape(server.metrics_url)
        assert again.error_code == 0
        assert again.producer_id_start == answers[recorded].producer_id_start
    granted = sum(a.producer_id_len for a in answers if a.error_code == 0)
    refused = [a for a in answers if a.error_code != 0]
    assert len(answers) > 3 * len([a for a in answers if a.error_code == 0])
    assert granted <= rate * elapsed + rate + 1000, (granted, elapsed)
    assert {a.error_code for a in refused} == {THROTTLING_QUOTA_EXCEEDED}
    assert metrics[f"pidctl_producer_ids_created_total{{{ANONYMOUS}}}"] == granted
    assert after[f"pidctl_producer_ids_created_total{{{ANONYMOUS}}}"] == granted
    assert metrics['pidctl_quota_refusals_total{api="allocate_producer_ids"}'] == len(refused)


def test_a_jobs_request_quota_is_its_principals_whatever_its_client_ids(tmp_path: Path) -> None:
    """Every block of a named job carries a new client id by design, so request quotas per
    client id did not bound jobs: a job's requests count under its principal."""
    server = ServerProcess(tmp_path / "d", "--allocate-producer-ids-quota", "5")
    with server, SyncClient(server.bootstrap) as job:
        keys = [f"pidctl-job/1/{block}/nightly" for block in range(10)]
        answers = job.pipeline([wire.allocate(-1, -1)] * 10, keys)
    assert all(a.error_code == 0 for a in answers)  # muted, not refused: it waited
    throttled = [a.throttle_time > datetime.timedelta(0) for a in answers]
    assert throttled == [False] * 5 + [True] * 5  # the burst, then every one throttled


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_quota_buckets_stay_bounded_whatever_client_ids_a_client_sends(tmp_path: Path) -> None:
    """With any request quota set, one connection sending a new 30,000-byte client id per
    request grew the server's RSS from 41 MiB to 3,746 MiB in 20 s (a bucket per client id,
    kept 300 s). Now the table is bounded and keeps a client id's hash: RSS stays flat."""
    server = ServerProcess(tmp_path / "d", "--init-producer-id-quota", "1000000")
    with server, SyncClient(server.bootstrap) as client:
        assert server.proc is not None
        pid = server.proc.pid
        client.request(requests.init_producer_id())
        before = _rss_mib(pid)
        sent, deadline = 0, time.monotonic() + 10.0
        while time.monotonic() < deadline:
            client_ids = [f"{sent + n:08d}" + "x" * 30_000 for n in range(50)]
            answers = client.pipeline([requests.init_producer_id()] * 50, client_ids)
            assert all(a.error_code == 0 for a in answers)
            sent += 50
        after = _rss_mib(pid)
        metrics = scrape(server.metrics_url)
    assert sent > 2_000  # (on the slowest machine: 60 MB of client ids)
    assert after < 100, (before, after, sent)
    assert metrics['pidctl_requests_total{api="init_producer_id",version="5"}'] >= sent
