from __future__ import annotations

import pytest

from pidctl.controller.core.quotas import NEW_PRODUCER_IDS, QuotaOverride, Quotas, TokenBuckets


def test_burst_then_throttle_for_the_deficit() -> None:
    buckets = TokenBuckets(rate=10, window_s=1)  # 10 requests/s, burst 10
    assert [buckets.take("a", 0.0) for _ in range(10)] == [0.0] * 10
    assert buckets.take("a", 0.0) == pytest.approx(0.1)  # one over: 1 token / 10 per s
    assert buckets.take("a", 0.0) == pytest.approx(0.2)
    assert buckets.take("a", 1.0) == 0.0  # refilled


def test_keys_are_independent_and_zero_rate_means_no_quota() -> None:
    buckets = TokenBuckets(rate=1, window_s=1)
    assert buckets.take("a", 0.0) == 0.0
    assert buckets.take("b", 0.0) == 0.0
    assert buckets.take("a", 0.0) > 0
    unlimited = TokenBuckets(rate=0)
    assert all(unlimited.take("a", 0.0) == 0.0 for _ in range(1000))


def test_idle_buckets_are_forgotten() -> None:
    buckets = TokenBuckets(rate=1)
    for i in range(100):
        buckets.take(i, 0.0)
    buckets.take("late", 1000.0)
    assert len(buckets) == 1


def test_quotas_by_api_principal_and_client_id() -> None:
    quotas = Quotas({67: 1.0}, connection_rate=2.0)
    assert quotas.request(67, "User:a", "c1", 0.0) == 0.0
    assert quotas.request(67, "User:a", "c1", 0.0) > 0  # same principal and client id
    assert quotas.request(67, "User:a", "c2", 0.0) == 0.0  # another client id
    assert quotas.request(22, "User:a", "c1", 0.0) == 0.0  # no quota on this API
    assert quotas.connection("10.0.0.1", 0.0) == quotas.connection("10.0.0.1", 0.0) == 0.0
    assert quotas.connection("10.0.0.1", 0.0) == pytest.approx(0.5)


def test_the_most_specific_override_applies() -> None:
    from pidctl.controller.core.quotas import QuotaOverride

    quotas = Quotas(
        {67: 10.0},
        overrides=(
            QuotaOverride(67, 1.0, principal="User:a", client_id="c"),
            QuotaOverride(67, 2.0, principal="User:a"),
            QuotaOverride(67, 3.0, client_id="c"),
            QuotaOverride(67, 0.0, principal="User:vip"),
        ),
    )
    assert quotas.rate(67, "User:a", "c") == 1.0
    assert quotas.rate(67, "User:a", "other") == 2.0
    assert quotas.rate(67, "User:b", "c") == 3.0
    assert quotas.rate(67, "User:b", "other") == 10.0
    assert quotas.rate(67, "User:vip", "c") == 0.0  # no quota for this one
    assert all(quotas.request(67, "User:vip", "c", 0.0) == 0.0 for _ in range(100))


def test_new_producer_ids_per_principal_with_overrides() -> None:
    quotas = Quotas(
        {},
        window_s=1.0,
        producer_ids_rate=2.0,
        overrides=(QuotaOverride(NEW_PRODUCER_IDS, 0.0, principal="User:bulk"),),
    )
    assert quotas.limits_producer_ids
    assert [quotas.producer_ids("User:a", 1, 0.0) for _ in range(2)] == [0.0, 0.0]
    assert quotas.producer_ids("User:a", 1, 0.0) == 0.5  # one more than the burst: 1/rate
    assert quotas.producer_ids("User:b", 1, 0.0) == 0.0  # per principal
    assert all(quotas.producer_ids("User:bulk", 100, 0.0) == 0.0 for _ in range(3))
    assert quotas.producer_ids("User:a", 1, 10.0) == 0.0  # refilled
    assert not Quotas({}).limits_producer_ids


def test_throttles_are_whole_milliseconds_rounded_as_kafka_rounds_them() -> None:
    """QuotaUtils.throttleTime: Math.round of the milliseconds, then > 0 throttles."""
    quotas = Quotas({67: 2_000.0}, window_s=1 / 2_000)  # a burst of 1, refilled in 0.5 ms
    assert quotas.request(67, "User:a", None, 0.0) == 0.0
    assert quotas.request(67, "User:a", None, 0.0001) == 0.0  # 0.4 ms: rounds to 0
    assert quotas.request(67, "User:a", None, 0.0001) == 0.001  # 0.9 ms: 1 ms
    assert quotas.request(67, "User:a", None, 0.0001) == 0.001  # 1.4 ms: 1 ms
