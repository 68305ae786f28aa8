"""Random and mutated frames thrown at a live server: it never crashes, never leaks a
connection task, never changes state for a request it refuses, and its memory stays bounded.
(The decoder alone is fuzzed in tests/protocol/test_codec.py.)"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.bench.common import rss_kib
from ops.testing.serverproc import ServerProcess
from pidctl.controller.log.recovery import read_log
from pidctl.protocol import requests
from pidctl.protocol.codec import encode_request
from tests import wire
from tests.e2e.test_operations import scrape

# Requests whose every decodable mutation is refused or read-only on a server with no
# registered broker, so no accepted request can change state either.
SEEDS = [
    encode_request(requests.api_versions(), 7, "fuzz"),
    encode_request(requests.metadata(["t"]), 8, "fuzz"),
    encode_request(requests.find_coordinator("tx"), 9, "fuzz"),
    encode_request(wire.allocate(3, 17), 10, "fuzz"),
    encode_request(wire.heartbeat(3, 17), 11, "fuzz"),
    encode_request(wire.unregister(3), 12, "fuzz"),
    encode_request(requests.describe_cluster(), 13, "fuzz"),
]


@st.composite
def mutated_frame(draw: st.DrawFn) -> bytes:
    seed = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, len(seed) - 1))
        seed[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        seed = seed[: draw(st.integers(0, len(seed)))]
    return bytes(seed)


frames = st.one_of(
    mutated_frame(),
    st.binary(max_size=64).map(lambda b: struct.pack(">i", len(b)) + b),
    st.binary(max_size=64),
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("fuzz") / "d",
        "--frame-timeout-ms",
        "200",
        "--connections-max-idle-ms",
        "200",
    )
    with server:
        yield server


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payloads=st.lists(frames, min_size=1, max_size=4))
def test_live_server_survives_fuzzed_frames(
    fuzz_server: ServerProcess, payloads: list[bytes]
) -> None:
    with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=5) as sock:
        for payload in payloads:
            try:
                sock.sendall(payload)
            except OSError:
                break
        try:
            sock.shutdown(socket.SHUT_WR)  # the server closed first if it refused the frame
            while sock.recv(65536):
                pass
        except OSError:
            pass
    assert fuzz_server.proc is not None and fuzz_server.proc.poll() is None


def test_after_fuzzing_state_tasks_and_memory_are_as_before(fuzz_server: ServerProcess) -> None:
    # Runs after the fuzz test in this module (pytest keeps file order).
    assert fuzz_server.proc is not None
    before = rss_kib(fuzz_server.proc.pid)
    for _ in range(2000):
        with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=5) as sock:
            sock.sendall(struct.pack(">i", 900_000) + b"\0" * 1000)  # a big frame, cut short
    deadline = time.monotonic() + 20
    while scrape(fuzz_server.metrics_url)["pidctl_connections"] != 0:
        assert time.monotonic() < deadline, "connection tasks left behind"
        time.sleep(0.1)
    records = [type(e.record).__name__ for e in read_log(fuzz_server.data_dir).entries()]
    assert records == ["ClusterCreated", "ControllerStarted"]  # nothing refused changed state
    assert rss_kib(fuzz_server.proc.pid) - before < 20_000  # KiB: bounded
    with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=5):
        pass
