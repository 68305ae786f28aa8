"""What is counted of each request (accounting.py), against real quotas and real metrics: a
strict quota's refusal before the decision, the throttle after it, the answers by API,
version and error, the producer ids created, the bytes and latency of the answers sent.
Rates are slow enough (one request per 100 s) that the test's own time never refills a
bucket."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.accounting import Accounting

INIT = "init_producer_id"
INIT_KEY = 22
ALICE = ConnectionInfo(principal="User:alice", peer="127.0.0.1:5000")
#: One request (or producer id) per 100 s: a bucket of one, refilled long after the test.
SLOW = 0.01


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _accounted(
    accounting: Accounting, error: int = 0, created: int = 0, refused: float = 0.0
) -> float:
    return accounting.accounted(
        INIT, 4, error, created, refused, INIT_KEY, "client", "client", 7, ALICE
    )


def test_without_a_quota_nothing_is_refused_or_throttled_and_each_answer_is_counted() -> None:
    metrics = Metrics()
    accounting = Accounting(Quotas({}), metrics)
    assert not accounting.one_at_a_time
    assert accounting.refusal(INIT, INIT_KEY, "client", True, ALICE) == 0.0
    assert _accounted(accounting, created=1) == 0.0
    assert _accounted(accounting, error=ErrorCode.coordinator_load_in_progress) == 0.0
    assert _sample(metrics, "pidctl_requests_total", api=INIT, version="4") == 2
    errors = {"api": INIT, "version": "4", "error": "COORDINATOR_LOAD_IN_PROGRESS"}
    assert _sample(metrics, "pidctl_request_errors_total", **errors) == 1
    assert _sample(metrics, "pidctl_producer_ids_created_total", principal="User:alice") == 1
    assert _sample(metrics, "pidctl_throttled_requests_total", api=INIT) == 0
    assert _sample(metrics, "pidctl_quota_refusals_total", api=INIT) == 0


def test_a_request_quota_throttles_the_request_that_crosses_it_then_refuses_undecided() -> None:
    """The second request empties the bucket of one: throttled by its refill (100 s); the
    third is refused before it is decided, and its refusal takes nothing more from the
    bucket (the refusal after it is no longer)."""
    metrics = Metrics()
    accounting = Accounting(Quotas({INIT_KEY: SLOW}), metrics)
    assert accounting.one_at_a_time
    assert _accounted(accounting) == 0.0
    throttle = _accounted(accounting)
    assert 99 < throttle <= 100
    refused = accounting.refusal(INIT, INIT_KEY, "client", False, ALICE)
    assert 99 < refused <= throttle
    assert (
        _accounted(accounting, error=ErrorCode.coordinator_load_in_progress, refused=refused)
        == refused
    )
    assert accounting.refusal(INIT, INIT_KEY, "client", False, ALICE) <= refused
    assert _sample(metrics, "pidctl_quota_refusals_total", api=INIT) == 2
    assert _sample(metrics, "pidctl_throttled_requests_total", api=INIT) == 2
    assert throttle + refused <= _sample(metrics, "pidctl_throttle_seconds_total", api=INIT)
    assert _sample(metrics, "pidctl_requests_total", api=INIT, version="4") == 3
    # Another principal has its own bucket.
    other = ConnectionInfo(principal="User:bob")
    assert accounting.refusal(INIT, INIT_KEY, "client", False, other) == 0.0


def test_producer_ids_created_are_counted_per_principal_and_throttled_by_their_rate() -> None:
    metrics = Metrics()
    accounting = Accounting(Quotas({}, producer_ids_rate=SLOW), metrics)
    assert accounting.one_at_a_time
    assert accounting.new_producer_ids("User:alice", 1) == 0.0
    throttle = accounting.new_producer_ids("User:alice", 1000)
    assert 99_000 < throttle <= 100_000
    assert _sample(metrics, "pidctl_producer_ids_created_total", principal="User:alice") == 1001
    assert _sample(metrics, "pidctl_producer_ids_throttled_total", principal="User:alice") == 1
    # A request that may create producer ids is refused while its principal is behind.
    assert accounting.refusal(INIT, INIT_KEY, None, True, ALICE) > 0
    assert accounting.refusal(INIT, INIT_KEY, None, False, ALICE) == 0.0


def test_the_request_log_needs_each_request_alone() -> None:
    assert Accounting(Quotas({}), Metrics(), log_requests=True).one_at_a_time


def test_answers_sent_are_counted_in_bytes_and_each_one_timed_from_its_receipt() -> None:
    metrics = Metrics()
    accounting = Accounting(Quotas({}), metrics)
    received = time.perf_counter()
    run = (INIT, received)
    accounting.sent(30, [run, run, (INIT, received), ("metadata", received)])
    accounting.sent(5, [])
    assert _sample(metrics, "pidctl_sent_bytes_total") == 35
    duration = "pidctl_request_duration_seconds_count"
    assert _sample(metrics, duration, api=INIT) == 3
    assert _sample(metrics, duration, api="metadata") == 1
