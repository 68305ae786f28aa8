"""Quotas over the wire: throttle_time_ms in the answer, then a muted connection (KIP-219),
whatever the client does with the field; delayed connections over the creation rate."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests import wire
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
