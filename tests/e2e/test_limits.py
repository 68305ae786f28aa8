"""Hostile clients: too many connections, idle connections, slowloris frames."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests
from pidctl.protocol.codec import encode_request
from tests.e2e.test_operations import scrape


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (None if it stayed open)."""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def _served(bootstrap: str) -> bool:
    try:
        with SyncClient(bootstrap, timeout=5) as client:
            return bool(client.request(requests.api_versions()).error_code == 0)
    except (ConnectionError, OSError):
        return False


def test_connections_per_address_and_in_total(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "d", "--max-connections-per-address", "3", "--max-connections", "5"
    )
    with server:
        held = [SyncClient(server.bootstrap) for _ in range(3)]
        for client in held:
            client.request(requests.api_versions())
        assert not _served(server.bootstrap)  # the 4th from 127.0.0.1 is closed at once
        held.pop().close()
        wait_until(lambda: _served(server.bootstrap), "a place freed by a closed connection")
        for client in held:
            client.close()


def test_idle_connection_is_closed(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d", "--connections-max-idle-ms", "300") as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        with sock:
            closed_after = _closed_within(sock, 5)
        assert closed_after is not None and closed_after > 0.2
        assert _served(server.bootstrap)
        # Closed by the idle timeout, by the server's own account (not by a clock here).
        closed = scrape(server.metrics_url)
        assert closed['pidctl_connections_closed_total{reason="idle"}'] == 1


def test_slowloris_frame_is_cut_off(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "d", "--frame-timeout-ms", "500", "--connections-max-idle-ms", "60000"
    )
    with server:
        frame = encode_request(requests.api_versions(), 1, "slow")
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            started = time.monotonic()
            for byte in frame[:-1]:  # one byte every 100 ms: never a whole frame in time
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.1)
                if time.monotonic() - started > 5:
                    break
            closed_after = _closed_within(sock, 5)
            elapsed = time.monotonic() - started
        assert closed_after is not None
        assert elapsed > 0.4
        # Cut off for the frame it never finished, not for being idle (60 s away).
        closed = scrape(server.metrics_url)
        assert closed['pidctl_connections_closed_total{reason="frame_timeout"}'] == 1
        assert 'pidctl_connections_closed_total{reason="idle"}' not in closed
        # A client that sends whole frames slowly, one request at a time, is fine.
        with SyncClient(server.bootstrap) as patient:
            for _ in range(3):
                assert patient.request(requests.api_versions()).error_code == 0
                time.sleep(0.3)


def test_a_frame_declaring_a_huge_size_allocates_nothing(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d") as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(struct.pack(">i", 2**31 - 1))
            assert _closed_within(sock, 5) is not None
        assert _served(server.bootstrap)
