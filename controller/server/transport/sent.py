"""What the writers tell of every write: the bytes sent, and each answer's latency.

Built before the writers (``outbox.py``), which call :meth:`AnswersSent.sent` after each
write they make (their ``on_sent``), and before the connections, which the writers serve.
"""

from __future__ import annotations

import time
from typing import Any

from pidctl.controller.api.purgatory import Timings
from pidctl.controller.server.telemetry.metrics import Metrics


class AnswersSent:
    """Counts the bytes the writers send, and observes the latency of each answer they
    finish, by API, from its request's receipt to its write."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # Metric children, resolved once: labels() costs a lock and a dict lookup per call.
        self._latency: dict[str, Any] = {}

    def sent(self, size: int, timings: Timings) -> None:
        """A write of ``size`` bytes finished the answers of ``timings`` (API, receipt)."""
        self.metrics.bytes_sent.inc(size)
        if timings:
            sent = time.perf_counter()
            # The answers of one round share their API and receipt (a run's, one timing):
            # each such stretch is observed at once.
            count, last = 0, timings[0]
            for timing in timings:
                if timing is last or timing == last:
                    count += 1
                    continue
                self._latency_of(last[0]).observe(sent - last[1], count)
                count, last = 1, timing
            self._latency_of(last[0]).observe(sent - last[1], count)

    def _latency_of(self, api: str) -> Any:
        child = self._latency.get(api)
        if child is None:
            child = self._latency[api] = self.metrics.latency.labels(api)
        return child
