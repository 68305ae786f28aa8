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


# -- strict quotas (KIP-599's): refused undecided while behind, whatever the connection --


def test_a_request_that_finds_its_bucket_behind_is_refused_and_not_counted() -> None:
    quotas = Quotas({22: 2.0})  # 2 requests/s, burst 2
    assert quotas.refusal(22, "User:a", "c", False, 0.0) == 0.0
    assert [quotas.request(22, "User:a", "c", 0.0) for _ in range(3)] == [0.0, 0.0, 0.5]
    # Another connection, the same key: refused for as long as the bucket is behind...
    assert quotas.refusal(22, "User:a", "c", False, 0.1) == pytest.approx(0.4)
    # ...however often it asks: a refusal is not counted, so the deficit stays one request.
    for _ in range(1000):
        assert quotas.refusal(22, "User:a", "c", False, 0.2) == pytest.approx(0.3)
    assert quotas.refusal(22, "User:a", "c", False, 0.5) == 0.0  # back at zero: decided
    assert quotas.request(22, "User:a", "c", 0.5) == 0.5
    # A client that waits as told is never refused: the throttle is the time to zero.
    assert quotas.refusal(22, "User:a", "c", False, 1.0) == 0.0


def test_a_throttle_rounded_down_never_makes_a_refusal() -> None:
    """A connection muted for a throttle rounded to whole milliseconds (down by up to half
    a millisecond) is not refused for the rest."""
    quotas = Quotas({22: 1000.0}, window_s=0.001)  # burst 1, 1 ms a request
    assert quotas.request(22, "User:a", None, 0.0) == 0.0
    assert quotas.request(22, "User:a", None, 0.0) == 0.001
    assert quotas.refusal(22, "User:a", None, False, 0.0006) == 0.0  # 0.4 ms behind
    assert quotas.refusal(22, "User:a", None, False, 0.0004) == 0.001  # 0.6 ms behind


def test_new_producer_ids_refuse_what_may_create_them_while_behind() -> None:
    quotas = Quotas({}, producer_ids_rate=10.0)  # burst 10
    assert quotas.producer_ids("User:a", 1000, 0.0) == pytest.approx(99.0)  # a job's block
    # Whatever may create producer ids is refused meanwhile, from any connection...
    assert quotas.refusal(22, "User:a", "other", True, 50.0) == pytest.approx(49.0)
    assert quotas.refusal(67, "User:a", None, True, 98.0) == pytest.approx(1.0)
    # ...nothing else is, nor another principal.
    assert quotas.refusal(22, "User:a", "other", False, 50.0) == 0.0
    assert quotas.refusal(22, "User:b", "other", True, 50.0) == 0.0
    assert quotas.refusal(22, "User:a", "other", True, 99.0) == 0.0


def test_what_a_key_gets_is_the_rate_plus_one_burst_plus_one_request() -> None:
    """A client asking as fast as it can on ever new connections (every refusal ignored):
    over any span it gets at most rate x span + burst + one request's count."""
    rate, span = 10.0, 30.0
    quotas = Quotas({}, producer_ids_rate=rate, window_s=1.0)
    granted, now = 0, 0.0
    while now < span:
        if not quotas.refusal(22, "User:a", None, True, now):
            quotas.producer_ids("User:a", 1, now)
            granted += 1
        now += 0.001
    assert rate * span <= granted <= rate * span + rate * 1.0 + 1


def test_quota_subject_counts_jobs_by_principal_and_brokers_blocks_as_no_new_ids() -> None:
    from types import SimpleNamespace

    from pidctl.controller.core.quotas import quota_subject

    job = SimpleNamespace(broker_id=-1, broker_epoch=-1)
    broker = SimpleNamespace(broker_id=3, broker_epoch=7)
    assert quota_subject(67, "pidctl-job/1/0/app", job) == (None, True)
    assert quota_subject(67, "kafka-3", broker) == ("kafka-3", False)
    assert quota_subject(22, "producer-1", None) == ("producer-1", True)
    assert quota_subject(3, "anything", None) == ("anything", False)


# -- bounded tables: whatever the client ids, a few MB --------------------------------


def test_buckets_are_bounded_and_new_client_ids_share_their_principals_overflow() -> None:
    quotas = Quotas({22: 1.0}, max_buckets=100)  # 1 request/s, burst 1
    throttled = 0
    for n in range(100_000):  # a new client id on every request, all at one moment
        client_id = f"c-{n}-" + "x" * 30_000
        if quotas.refusal(22, "User:a", client_id, False, 0.0):
            throttled += 1
            continue
        quotas.request(22, "User:a", client_id, 0.0)
    assert quotas.request_buckets <= 101  # the table, and User:a's overflow bucket
    # The first 100 client ids had a bucket each; every later one the overflow bucket,
    # whose burst of 1 and one request beyond it went to the first two: the rest were
    # refused.
    assert throttled == 100_000 - 102
    # Another principal has its own overflow bucket: not held back by User:a's.
    assert quotas.refusal(22, "User:b", "new", False, 0.0) == 0.0
    quotas.request(22, "User:b", "new", 0.0)
    # Buckets full again make room: a second later every bucket has refilled.
    assert quotas.refusal(22, "User:a", "later", False, 1.0) == 0.0
    assert quotas.request(22, "User:a", "later", 1.0) == 0.0
    assert quotas.request_buckets <= 102


def test_a_bucket_in_deficit_is_kept_however_old() -> None:
    """Forgetting a bucket still behind would forgive its deficit."""
    buckets = TokenBuckets(rate=1.0, window_s=1.0, max_buckets=2)
    buckets.take("b", 0.0)
    assert buckets.take("deep", 0.0, count=1000) == pytest.approx(999.0)
    assert buckets.room_for("c", 500.0)  # "b", the least recently used, is full again
    buckets.take("c", 500.0)
    assert not buckets.room_for("d", 500.0)  # "deep" and "c" in use: no room
    assert buckets.behind("deep", 500.0) == pytest.approx(499.0)
    assert len(buckets) == 2


def test_connection_buckets_are_bounded_too() -> None:
    quotas = Quotas({}, connection_rate=1.0, max_buckets=10)
    delays = [quotas.connection(f"2001:db8::{n:x}", 0.0) for n in range(1000)]
    assert delays[:11] == [0.0] * 11  # ten addresses, then the shared bucket's burst
    assert all(delay > 0 for delay in delays[11:])
    assert len(quotas._connections) <= 11
