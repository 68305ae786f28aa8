from __future__ import annotations

from prometheus_client import generate_latest

from pidctl.controller.server.metrics import Metrics, RateWindow


def test_rate_window_counts_the_last_hour_only() -> None:
    window = RateWindow(window_s=3600, bucket_s=60)
    window.add(3600, now_s=0)
    assert window.per_second(now_s=10) == 1.0
    window.add(7200, now_s=1800)
    assert window.per_second(now_s=1800) == 3.0
    assert window.per_second(now_s=3600 + 60) == 2.0  # the first minute fell out
    assert window.per_second(now_s=10_000) == 0.0


def test_rate_window_drops_buckets_that_left_the_window() -> None:
    window = RateWindow(window_s=120, bucket_s=60)
    for minute in range(10):
        for _ in range(3):  # several grants per bucket
            window.add(60, now_s=minute * 60 + 1)
    assert window.per_second(now_s=9 * 60 + 1) == (60 * 3 * 2) / 120
    assert len(window._buckets) == 2  # the window's minutes, not all ten


def test_granted_blocks_are_counted_per_holder_and_broker() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.granted("broker", 1, 1000)
    metrics.granted("broker", 2, 1000)
    metrics.granted("controller", 1, 1000)
    exposed = generate_latest(metrics.registry).decode()
    for labels, value in (
        ('broker="1",holder="broker"', 3.0),
        ('broker="2",holder="broker"', 1.0),
        ('broker="1",holder="controller"', 1.0),
    ):
        assert f"pidctl_producer_id_blocks_granted_total{{{labels}}} {value}" in exposed
