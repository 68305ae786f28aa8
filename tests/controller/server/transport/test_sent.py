"""What the writers tell of each write: its bytes, and the latency of each answer it
finished, observed per stretch of answers of one API and receipt."""

from __future__ import annotations

import time

from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.sent import AnswersSent


def _count(metrics: Metrics, api: str) -> float:
    value = metrics.registry.get_sample_value("pidctl_request_duration_seconds_count", {"api": api})
    return value or 0.0


def test_bytes_and_each_finished_answer_are_counted() -> None:
    metrics = Metrics()
    sent = AnswersSent(metrics)
    received = time.perf_counter()
    run = ("init_producer_id", received)
    # A run's answers share one timing; then another API's answer.
    sent.sent(300, [run, run, run, ("metadata", received)])
    sent.sent(20, ())  # a stalled write's first part: no answer finished
    assert metrics.registry.get_sample_value("pidctl_sent_bytes_total") == 320
    assert _count(metrics, "init_producer_id") == 3
    assert _count(metrics, "metadata") == 1
