"""The compiled load generator: it loads the real server, and it refuses every wrong answer.

The wrong answers come from a small scripted server in this file: a real TCP server that
answers InitProducerId the way a broken server would (the thing under test is the load
generator's checking, and pidctl never answers wrongly on purpose)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from kio.schema.errors import ErrorCode

from ops.bench import cloadgen
from ops.bench.ceiling import canned_responses
from ops.bench.common import ceiling_server
from ops.testing.serverproc import ServerProcess
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import decode_response
from pidctl.protocol.framing import FrameDecoder


def test_the_binary_is_built_once_per_source() -> None:
    first = cloadgen.binary()
    assert first.exists() and first.parent == cloadgen.BUILD_DIR
    assert cloadgen.binary() == first


@pytest.mark.parametrize("scenario", cloadgen.SCENARIOS)
def test_each_scenario_loads_the_server_and_checks_every_answer(
    server: ServerProcess, scenario: str
) -> None:
    assert server.proc is not None
    load = cloadgen.scenario_load(server.bootstrap, scenario)
    result = cloadgen.run(
        server.bootstrap, load, connections=3, in_flight=2, seconds=0.3, pids=[server.proc.pid]
    )
    assert result["requests"] > 0
    # Every answer's PID and epoch (or block) went into the uniqueness check.
    assert result["unique_checked"] == result["requests"]
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["servers"][0]["pid"] == server.proc.pid
    assert result["servers"][0]["cpu_s"] > 0 and result["client_cpu_s"] >= 0
    assert sum(count for _, count in result["histogram_us"]) == result["requests"]


def test_transactional_ids_are_one_per_connection(server: ServerProcess) -> None:
    cloadgen.run(server.bootstrap, cloadgen.transactional("own-"), connections=3, seconds=0.2)
    metrics = _metrics(server)
    # Three ids, each initialised many times: the server holds exactly three.
    assert "pidctl_transactional_ids 3.0" in metrics


def test_allocate_registers_each_broker_and_uses_its_epoch(server: ServerProcess) -> None:
    load = cloadgen.scenario_load(server.bootstrap, "allocate", broker_base=500)
    result = cloadgen.run(server.bootstrap, load, connections=4, seconds=0.2)
    assert result["requests"] > 0
    # Without the registration the same brokers are refused: STALE_BROKER_EPOCH.
    unregistered = cloadgen.allocate(600)
    with pytest.raises(cloadgen.LoadFailed, match="answered with error 77"):
        cloadgen.run(server.bootstrap, unregistered, connections=1, seconds=0.1)


def test_the_storm_asks_api_versions_then_init_producer_id(server: ServerProcess) -> None:
    result = cloadgen.run(
        server.bootstrap, cloadgen.storm_load(), connections=50, storm=True, spread=0.2
    )
    assert result["served"] == 50 and result["unique_checked"] == 50
    assert 0 < result["p50_s"] <= result["last_served_s"]
    assert [fraction for _, fraction in result["curve"]][::20] == [0.0, 1.0]
    metrics = _metrics(server)
    assert 'pidctl_requests_total{api="api_versions",version="3"} 50.0' in metrics
    assert 'pidctl_requests_total{api="init_producer_id",version="5"} 50.0' in metrics


def test_canned_answers_fail_the_uniqueness_checks() -> None:
    with ceiling_server() as ceiling:
        with pytest.raises(cloadgen.LoadFailed, match="handed out twice: 0, 0"):
            cloadgen.run(ceiling, cloadgen.idempotent(), connections=1, seconds=0.1)
        with pytest.raises(cloadgen.LoadFailed, match="blocks at 0 and 0 overlap"):
            cloadgen.run(ceiling, cloadgen.allocate(1), connections=1, seconds=0.1)
        # Unchecked, the ceiling is a baseline.
        assert cloadgen.run(ceiling, cloadgen.idempotent().unchecked(), seconds=0.1)["requests"]


def test_offsets_of_the_answers_fields_match_kio() -> None:
    canned = canned_responses()
    answer = canned[struct.pack(">hh", ApiKey.INIT_PRODUCER_ID, 5)]
    frame = answer[0] + b"\0\0\0\7" + answer[1]
    body = frame[4 + 4 + 1 :]  # length, correlation id, the header's empty tagged fields
    decoded = decode_response(frame[4:], ApiKey.INIT_PRODUCER_ID, 5)
    assert struct.unpack_from(">h", body, cloadgen.THROTTLED_ERROR_AT)[0] == decoded.error_code
    assert struct.unpack_from(">q", body, cloadgen.PRODUCER_ID_AT)[0] == decoded.producer_id
    assert struct.unpack_from(">h", body, cloadgen.PRODUCER_EPOCH_AT)[0] == decoded.producer_epoch
    answer = canned[struct.pack(">hh", ApiKey.ALLOCATE_PRODUCER_IDS, 0)]
    body = answer[1][1:]
    assert struct.unpack_from(">i", body, cloadgen.BLOCK_LENGTH_AT)[0] == 1000


# -- wrong answers, from a scripted server ---------------------------------------------------

#: (correlation id, error code, producer id) of the n-th answer, given the request's
#: correlation id; None: close the connection instead.
Script = Callable[[int, int], tuple[int, int, int] | None]


@contextlib.contextmanager
def scripted_server(script: Script) -> Iterator[str]:
    """A TCP server answering every InitProducerId v5 as ``script`` says."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                decoder, n = FrameDecoder(), 0
                while data := conn.recv(65536):
                    for frame in decoder.feed(data):
                        correlation = struct.unpack_from(">i", frame, 4)[0]
                        answer = script(correlation, n)
                        n += 1
                        if answer is None:
                            return
                        body = struct.pack(">BihqhB", 0, 0, answer[1], answer[2], 0, 0)
                        conn.sendall(struct.pack(">ii", 4 + len(body), answer[0]) + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        listener.close()
        thread.join(timeout=30)


def _failure(script: Script, load: cloadgen.Load | None = None, in_flight: int = 1) -> str:
    with scripted_server(script) as address, pytest.raises(cloadgen.LoadFailed) as failed:
        cloadgen.run(
            address,
            load or cloadgen.idempotent(),
            connections=1,
            in_flight=in_flight,
            seconds=0.3,
        )
    return str(failed.value)


def test_an_answer_out_of_order_fails_the_run() -> None:
    message = _failure(lambda correlation, n: (correlation + (n == 5), 0, n), in_flight=2)
    assert "answer with correlation id 6 while 5 was expected" in message


def test_an_unexpected_error_code_fails_the_run() -> None:
    fenced = ErrorCode.producer_fenced.value
    message = _failure(lambda correlation, n: (correlation, fenced if n == 3 else 0, n))
    assert f"answered with error {fenced}" in message


def test_a_pid_handed_out_twice_fails_the_run() -> None:
    message = _failure(lambda correlation, n: (correlation, 0, n % 7))
    assert "handed out twice" in message


def test_a_closed_connection_fails_the_run() -> None:
    message = _failure(lambda correlation, n: None if n == 4 else (correlation, 0, n))
    assert "the server closed the connection" in message


def test_the_retriable_error_is_retried_after_the_backoff() -> None:
    busy = ErrorCode.coordinator_load_in_progress.value
    with scripted_server(lambda c, n: (c, busy if n < 2 else 0, n)) as address:
        result = cloadgen.run(address, cloadgen.idempotent(), connections=1, storm=True, spread=0.0)
    assert result["served"] == 1 and result["retries"] == 2
    # Two back-offs of 50 ms each before the answer that served it.
    assert result["last_served_s"] >= 2 * cloadgen.RETRY_MS / 1000


def test_load_mode_sends_a_retriable_answer_again_after_the_backoff() -> None:
    # Kafka's broker answers 14 while it waits for a block of PIDs from its controller.
    busy = ErrorCode.coordinator_load_in_progress.value
    with scripted_server(lambda c, n: (c, busy if n in (3, 4, 9) else 0, n)) as address:
        result = cloadgen.run(
            address, cloadgen.idempotent(), connections=1, in_flight=2, seconds=0.3
        )
    assert result["retries"] == 3
    # Only the answers without an error count (their PIDs all different).
    assert result["requests"] == result["unique_checked"] > 0


def test_load_mode_ends_while_requests_wait_to_be_retried() -> None:
    busy = ErrorCode.coordinator_load_in_progress.value
    with scripted_server(lambda c, n: (c, busy if n >= 2 else 0, n)) as address:
        result = cloadgen.run(
            address, cloadgen.idempotent(), connections=1, in_flight=2, seconds=0.3, deadline=60
        )
    assert result["requests"] == 2 and result["retries"] > 0


def test_the_costs_include_the_time_spent_waiting_for_a_cpu(server: ServerProcess) -> None:
    assert server.proc is not None
    result = cloadgen.run(
        server.bootstrap, cloadgen.idempotent(), connections=2, seconds=0.3, pids=[server.proc.pid]
    )
    # Busy: on a CPU, or runnable and waiting for one (the run queue's delay).
    assert result["client_runqueue_s"] >= 0 and result["servers"][0]["runqueue_s"] >= 0
    assert result["client_busy_share"] >= result["client_cpu_share"] > 0
    assert result["machine_busy_cores"] > 0 and result["machine_steal_cores"] >= 0


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
    return text
