"""One client must not hold the event loop: pipelined expensive requests and oversized arrays
from a real socket, while a well-behaved client's latency is measured against its own
baseline of the same run (tests/latency.py)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kio.schema.find_coordinator.v4 import FindCoordinatorRequest
from kio.schema.metadata.v0 import MetadataRequest
from kio.schema.metadata.v0.request import MetadataRequestTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8

from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests
from pidctl.protocol.codec import decode_response, encode_request
from tests import latency

#: Requests of one pipelined write: a connection's max_in_flight_per_connection (64).
PIPELINED = 64


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(min(n - len(data), 1 << 20))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return bytes(data)

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def _many_keys() -> tuple[bytes, Any, int]:
    """64 FindCoordinator v4 of 1,000 keys each (the most max_coordinator_keys allows), in
    one write of ~129 KB: each is answered in full."""
    body = FindCoordinatorRequest(
        key_type=i8(1), coordinator_keys=tuple(f"t{i:05d}" for i in range(1000))
    )
    write = b"".join(encode_request(body, n, "attacker") for n in range(PIPELINED))
    return write, body, PIPELINED


def _many_topics() -> tuple[bytes, Any, int]:
    """One Metadata v0 naming 500,000 empty topics: a 1 MiB frame (max_frame_bytes)."""
    body = MetadataRequest(topics=(MetadataRequestTopic(name=TopicName("")),) * 500_000)
    frame = encode_request(body, 1, "attacker")
    assert len(frame) <= 1 << 20
    return frame, body, 1


class Attacker:
    """Sends ``write`` on a real socket, reads its ``answers`` answers, again, until stopped."""

    def __init__(self, bootstrap: str, write: bytes, body: Any, answers: int) -> None:
        self.address = bootstrap.rsplit(":", 1)
        self.write, self.body, self.answers = write, body, answers
        self.rounds = 0
        self.first: Any = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            host, port = self.address
            with socket.create_connection((host, int(port)), timeout=120) as sock:
                while not self._stop.is_set():
                    sock.sendall(self.write)
                    for _ in range(self.answers):
                        frame = _read_frame(sock)
                        if self.first is None:
                            self.first = decode_response(
                                frame, self.body.__api_key__, self.body.__version__
                            )
                    self.rounds += 1
        except BaseException as e:  # for the test to see
            self.error = e

    def __enter__(self) -> Attacker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


@pytest.mark.parametrize("attack", [_many_keys, _many_topics], ids=["keys", "topics"])
def test_one_client_does_not_hold_the_event_loop(
    tmp_path: Path, attack: Callable[[], tuple[bytes, Any, int]]
) -> None:
    write, body, answers = attack()
    with ServerProcess(tmp_path / "d") as server, SyncClient(server.bootstrap) as client:

        def init() -> None:
            assert client.request(requests.init_producer_id()).error_code == 0

        baseline = latency.measure(init, 300)
        with Attacker(server.bootstrap, write, body, answers) as attacker:
            wait_until(lambda: attacker.rounds >= 1 or attacker.error is not None, "an attack")
            attacked = latency.measure_while(
                init, 300, lambda: attacker.rounds >= 4 or attacker.error is not None
            )
        assert attacker.error is None, attacker.error
        print(
            f"{attack.__name__}: p99 {attacked.p99 * 1000:.1f} ms under attack "
            f"({attacker.rounds} attack rounds), {baseline.p99 * 1000:.1f} ms before; "
            f"worst {attacked.worst * 1000:.1f} ms"
        )
        assert attacked.p99 < latency.bound(baseline), (attacked.p99, baseline.p99)
        first = attacker.first
        if attack is _many_keys:
            assert [c.error_code for c in first.coordinators] == [0] * 1000
        else:
            # Refused before its 500,000 entries were decoded: INVALID_REQUEST.
            assert [t.error_code for t in first.topics] == [42]
