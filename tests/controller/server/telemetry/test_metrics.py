from __future__ import annotations

import os
import re
import time

from prometheus_client import generate_latest

from pidctl.controller.server.telemetry.metrics import Metrics, RateWindow


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


def test_build_info_and_process_metrics_are_exported() -> None:
    """A restart shows as a new process_start_time_seconds, not only as counters reset."""
    import platform

    from pidctl.protocol import __version__

    exposed = generate_latest(Metrics().registry).decode()
    running = "compiled" if os.environ.get("TEST_BUILD") == "compiled" else "interpreted"
    labels = f'build="{running}",python="{platform.python_version()}",version="{__version__}"'
    assert f"pidctl_build_info{{{labels}}} 1.0" in exposed
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert re.search(rf"^{name} [0-9.e+]+$", exposed, re.M), name


def test_snapshot_age_counts_from_when_the_state_was_written() -> None:
    metrics = Metrics()
    assert "pidctl_snapshot_age_seconds" not in generate_latest(metrics.registry).decode()
    metrics.state_written_at(time.time() - 3600)  # at start-up: no snapshot, formatted 1 h ago
    age = _sample(metrics, "pidctl_snapshot_age_seconds")
    assert 3600 <= age < 3600 + 60
    metrics.snapshot_written(100)
    assert _sample(metrics, "pidctl_snapshot_age_seconds") < 60


def _sample(metrics: Metrics, name: str) -> float:
    exposed = generate_latest(metrics.registry).decode()
    found = re.search(rf"^{name} (\S+)$", exposed, re.M)
    assert found is not None, name
    return float(found.group(1))
