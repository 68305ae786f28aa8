"""The real `pidctl serve` on a loopback port, driven over TCP."""

from __future__ import annotations

import itertools
import re
import socket
import struct
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.api_versions.v0 import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v4 import ApiVersionsRequest as ApiVersionsV4
from kio.schema.errors import ErrorCode

from ops.testing.serverproc import (
    ServerProcess,
    connect_without_waiting,
    strace_inject_prefix,
    wait_until,
)
from pidctl.client import SyncClient
from pidctl.controller.log.datadir import read_reservation
from pidctl.protocol.codec import decode_response, encode_request
from pidctl.protocol.framing import FrameDecoder
from tests import wire
from tests.e2e.test_operations import scrape


def _raw(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def _read_frame(sock: socket.socket) -> bytes | None:
    decoder = FrameDecoder()
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        frames = decoder.feed(chunk)
        if frames:
            return frames[0]


def _is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_api_versions_every_version(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap) as client:
        for body in (
            ApiVersionsV0(),
            ApiVersionsV4(client_software_name="t", client_software_version="1"),
        ):
            response = client.request(body)
            assert response.error_code == ErrorCode.none
            listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            assert listed[18] == (0, 4) and listed[67] == (0, 0)


def test_unsupported_api_versions_version_gets_v0_answer_and_connection_stays(
    server: ServerProcess,
) -> None:
    frame = encode_request(
        ApiVersionsV4(client_software_name="x", client_software_version="1"), 5, "c"
    )
    future = frame[:6] + struct.pack(">h", 9) + frame[8:]  # ApiVersions v9
    with _raw(server) as sock:
        sock.sendall(future)
        response = decode_response(_read_frame(sock), 18, 0)  # type: ignore[arg-type]
        assert response.error_code == ErrorCode.unsupported_version
        assert [(k.api_key, k.max_version) for k in response.api_keys] == [(18, 4)]
        sock.sendall(encode_request(ApiVersionsV0(), 6, "c"))
        assert decode_response(_read_frame(sock), 18, 0).error_code == ErrorCode.none  # type: ignore[arg-type]


def test_invalid_client_software_name_is_invalid_request(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap) as client:
        response = client.request(
            ApiVersionsV4(client_software_name="-x-", client_software_version="1")
        )
        assert response.error_code == ErrorCode.invalid_request
        assert response.api_keys == ()  # as Kafka: no API listed


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 10) + bytes.fromhex("0000 0009 00000001 ffff"),  # Produce: unknown to us
        encode_request(wire.allocate(1, 1), 1, "c")[:6]
        + b"\x00\x07"
        + encode_request(wire.allocate(1, 1), 1, "c")[8:],
        struct.pack(">i", 3) + b"\x00\x43\x00",  # header cut short
        struct.pack(">i", 64 * 1024 * 1024),  # far above max_frame_bytes
        struct.pack(">i", -5),
    ],
    ids=["unknown-api", "unsupported-version", "malformed", "oversized", "negative-size"],
)
def test_bad_frames_close_only_their_connection(server: ServerProcess, frame: bytes) -> None:
    with SyncClient(server.bootstrap) as bystander, _raw(server) as sock:
        sock.sendall(frame)
        assert _is_closed(sock)
        assert bystander.request(ApiVersionsV0()).error_code == ErrorCode.none
    assert server.proc is not None and server.proc.poll() is None


@pytest.mark.parametrize("error", ["ECONNABORTED", "ECONNRESET", "EPERM"])
def test_a_connection_that_failed_before_it_was_accepted_is_skipped(
    tmp_path: Path, error: str
) -> None:
    """accept(2) reports a connection that died in the backlog (reset, refused by a
    firewall): the server accepts the next one. strace makes accepts really fail (the
    connection stays queued, and a later accept takes it): the second to fifth, since the
    metrics listener tries one accept as it starts."""
    trace = tmp_path / "strace.log"
    failing = strace_inject_prefix("accept4", f"error={error}", "2..5", None)
    failing[failing.index("/dev/null")] = str(trace)
    with (
        ServerProcess(tmp_path / "d", prefix=failing) as server,
        SyncClient(server.bootstrap) as client,
    ):
        assert client.request(ApiVersionsV0()).error_code == ErrorCode.none
        with SyncClient(server.bootstrap) as another:
            assert another.request(ApiVersionsV0()).error_code == ErrorCode.none
        assert server.proc is not None and server.proc.poll() is None
    # The failures met the Kafka listener: the descriptor that accepted the clients.
    calls = re.findall(r"accept4\((\d+), .*\) = (-1 \w+ .*INJECTED|\d+)", trace.read_text())
    failed = {fd for fd, result in calls if "INJECTED" in result}
    accepted = {fd for fd, result in calls if "INJECTED" not in result}
    assert len([1 for _, result in calls if "INJECTED" in result]) == 4
    assert failed and failed <= accepted


def test_broker_lifecycle_and_allocation(server: ServerProcess) -> None:
    cluster = wire.cluster_id_of(server.data_dir)
    with SyncClient(server.bootstrap) as client:
        wrong = client.request(wire.registration(1, "not-the-cluster"))
        assert wrong.error_code == ErrorCode.inconsistent_cluster_id and wrong.broker_epoch == -1
        incarnation = uuid.uuid4()
        epoch = client.request(wire.registration(1, cluster, incarnation)).broker_epoch
        assert epoch > 0
        retry = client.request(wire.registration(1, cluster, incarnation))
        assert (retry.error_code, retry.broker_epoch) == (ErrorCode.none, epoch)

        beat = client.request(wire.heartbeat(1, epoch))
        assert beat.error_code == ErrorCode.none and not beat.is_fenced and beat.is_caught_up
        # Unfenced with a live session: another incarnation may not take the id.
        duplicate = client.request(wire.registration(1, cluster, uuid.uuid4()))
        assert duplicate.error_code == ErrorCode.duplicate_broker_registration
        assert (
            client.request(wire.heartbeat(1, epoch + 100)).error_code
            == ErrorCode.stale_broker_epoch
        )

        first = client.request(wire.allocate(1, epoch))
        second = client.request(wire.allocate(1, epoch))
        assert (first.error_code, first.producer_id_start, first.producer_id_len) == (0, 0, 1000)
        assert (second.producer_id_start, second.producer_id_len) == (1000, 1000)
        stale = client.request(wire.allocate(1, epoch + 1))
        assert (stale.error_code, stale.producer_id_start, stale.producer_id_len) == (
            ErrorCode.stale_broker_epoch,
            0,
            0,
        )
        unknown = client.request(wire.allocate(2, epoch))
        assert unknown.error_code == ErrorCode.stale_broker_epoch

        assert client.request(wire.unregister(1)).error_code == ErrorCode.none
        assert client.request(wire.allocate(1, epoch)).error_code == ErrorCode.stale_broker_epoch
        assert client.request(wire.unregister(1)).error_code == ErrorCode.broker_id_not_registered


def _answers_in_order(bootstrap: str, cluster: str) -> None:
    with SyncClient(bootstrap) as client:
        epoch = wire.register(client, 3, cluster)
        bodies = [wire.allocate(3, epoch) if i % 5 else ApiVersionsV0() for i in range(500)]
        responses = client.pipeline(bodies)  # ClientProtocol checks correlation order
    starts = [r.producer_id_start for r in responses if hasattr(r, "producer_id_start")]
    assert starts == sorted(starts) and len(set(starts)) == 400
    assert all(b - a == 1000 for a, b in itertools.pairwise(starts))


def test_pipelined_requests_are_answered_in_order(server: ServerProcess) -> None:
    _answers_in_order(server.bootstrap, wire.cluster_id_of(server.data_dir))


def test_pipelined_requests_past_the_in_flight_limit_wait_and_are_answered(
    tmp_path: Path,
) -> None:
    """Two requests at most wait for their answers: the rest of the pipeline is decided as
    answers are written (grants wait for the log, ApiVersions behind them), in order."""
    with ServerProcess(tmp_path / "d", "--max-in-flight-per-connection", "2") as server:
        _answers_in_order(server.bootstrap, wire.cluster_id_of(server.data_dir))


def test_a_client_that_does_not_read_stalls_only_itself(server: ServerProcess) -> None:
    """Back-pressure: a client pipelines requests and reads nothing. The server's in-flight
    queue fills, it stops reading that connection and TCP pushes back, while other clients
    are served; once the client reads, every answer arrives."""
    request = encode_request(ApiVersionsV0(), 0, "slow")
    chunk = request * 50_000
    cap = 256 * 1024 * 1024
    with socket.socket() as slow, SyncClient(server.bootstrap) as other:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", server.port))
        slow.setblocking(False)
        sent = 0
        while sent < cap:
            try:
                sent += slow.send(chunk[sent % len(chunk) :])
            except BlockingIOError:
                break
        assert sent < cap, "the server kept reading a client that never reads"
        assert other.request(ApiVersionsV0()).error_code == ErrorCode.none
        slow.setblocking(True)
        slow.settimeout(30)
        expected = sent // len(request)
        decoder, answered = FrameDecoder(), 0
        while answered < expected:
            data = slow.recv(1 << 20)
            assert data, "connection closed before every request was answered"
            answered += len(decoder.feed(data))
        assert answered == expected


def test_connections_waiting_only_for_a_request_are_read_by_the_shared_poller(
    server: ServerProcess,
) -> None:
    def polled() -> float:
        return scrape(server.metrics_url)["pidctl_connections_polled"]

    with SyncClient(server.bootstrap) as first, SyncClient(server.bootstrap) as second:
        for client in (first, second):
            assert client.request(ApiVersionsV0()).error_code == ErrorCode.none
        wait_until(lambda: polled() == 2, "both connections in the poller", 30)
        assert first.request(ApiVersionsV0()).error_code == ErrorCode.none  # served there
    wait_until(lambda: polled() == 0, "closed connections out of the poller", 30)


def test_state_survives_a_kill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with ServerProcess(data_dir) as server:
        cluster = wire.cluster_id_of(data_dir)
        incarnation = uuid.uuid4()
        with SyncClient(server.bootstrap) as client:
            epoch = client.request(wire.registration(5, cluster, incarnation)).broker_epoch
            last = client.pipeline([wire.allocate(5, epoch) for _ in range(7)])[-1]
        server.kill()
        reserved = read_reservation(data_dir)
        server.start()
        with SyncClient(server.bootstrap) as client:
            # The registration survived; the restarted controller gives the broker a fresh
            # session, so another incarnation cannot take the id straight away.
            again = client.request(wire.registration(5, cluster, incarnation))
            assert again.broker_epoch == epoch
            other = client.request(wire.registration(5, cluster, uuid.uuid4()))
            assert other.error_code == ErrorCode.duplicate_broker_registration
            after = client.request(wire.allocate(5, epoch))
            # After a crash, grants go on above the reservation, not at the log's end: the
            # log's tail may have lost acknowledged grants (docs/log-format.md).
            assert after.producer_id_start == reserved > last.producer_id_start


def test_second_server_on_the_same_data_dir_refuses_to_start(server: ServerProcess) -> None:
    with pytest.raises(RuntimeError, match="in use by another pidctl"):
        ServerProcess(server.data_dir).start()


def test_sigterm_exits_cleanly_and_keeps_every_grant(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir).start()
    cluster = wire.cluster_id_of(data_dir)
    with SyncClient(server.bootstrap) as client:
        epoch = wire.register(client, 1, cluster)
        acked = client.pipeline([wire.allocate(1, epoch) for _ in range(50)])
    assert server.terminate() == 0
    assert any(e["event"] == "stopped" for e in server.events)
    server.start()
    with SyncClient(server.bootstrap) as client:
        nxt = client.request(wire.allocate(1, epoch))
    server.kill()
    assert nxt.producer_id_start == max(r.producer_id_start for r in acked) + 1000


def test_an_accept_error_of_the_listener_itself_stops_the_server_and_says_so(
    tmp_path: Path,
) -> None:
    """An accept error that is neither one connection's nor "not now" (EINVAL: the
    listening socket itself is wrong) stops the server, with an event naming it."""
    failing = strace_inject_prefix("accept4", "error=EINVAL", "2", None)
    server = ServerProcess(tmp_path / "d", prefix=failing).start()
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=10).close()
        assert server.proc is not None
        assert server.proc.wait(60) == 1
    finally:
        server.kill()

    def failures() -> list[dict[str, Any]]:
        return [e for e in server.events if e.get("event") == "accept failed; stopping"]

    wait_until(lambda: bool(failures()), "the failure logged")  # (stderr read in a thread)
    [failed] = failures()
    assert failed["error"] == "EINVAL" and failed["listener"].startswith("PLAINTEXT://")


class ConnectFlood:
    """Two threads opening connections to ``port`` and dropping them, 200 at a time (the
    connects not waited for), until the context ends; ``opened`` counts them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(2)]

    def __enter__(self) -> ConnectFlood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            socks = [connect_without_waiting(self.port) for _ in range(200)]
            self.opened += len(socks)
            for sock in socks:
                sock.close()


def test_sigterm_while_connections_arrive_exits_cleanly(tmp_path: Path) -> None:
    """The accepting stops before the listening sockets are closed: an accept woken just
    before the shutdown's cancel once ran on the closed socket, and EBADF stopped the server
    (exit 1, no final flush) in one to three SIGTERMs of six."""
    data_dir = tmp_path / "data"
    for _ in range(6):
        server = ServerProcess(data_dir).start()
        with ConnectFlood(server.port) as flood:
            wait_until(lambda: flood.opened >= 2000, "the flood under way")
            assert server.terminate() == 0, server.stderr_lines[-3:]
        assert any(e["event"] == "stopped" for e in server.events)


def test_range_settings_are_honoured(tmp_path: Path) -> None:
    with ServerProcess(
        tmp_path / "d", "--first-producer-id", "5000", "--last-producer-id", "6999"
    ) as server:
        cluster = wire.cluster_id_of(server.data_dir)
        with SyncClient(server.bootstrap) as client:
            epoch = wire.register(client, 1, cluster)
            a, b, c = client.pipeline([wire.allocate(1, epoch) for _ in range(3)])
    assert (a.producer_id_start, b.producer_id_start) == (5000, 6000)
    assert c.error_code == ErrorCode.unknown_server_error and c.producer_id_len == 0
