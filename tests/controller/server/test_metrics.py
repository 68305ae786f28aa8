from __future__ import annotations

from pidctl.controller.server.metrics import RateWindow


def test_rate_window_counts_the_last_hour_only() -> None:
    window = RateWindow(window_s=3600, bucket_s=60)
    window.add(3600, now_s=0)
    assert window.per_second(now_s=10) == 1.0
    window.add(7200, now_s=1800)
    assert window.per_second(now_s=1800) == 3.0
    assert window.per_second(now_s=3600 + 60) == 2.0  # the first minute fell out
    assert window.per_second(now_s=10_000) == 0.0
