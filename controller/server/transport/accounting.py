"""What is counted of each request a connection answers, whichever its API: a strict
quota's refusal before it is decided, the throttle its quotas ask for after (KIP-219), the
answer by API, version and error, the producer ids it created, the request log's line, the
bytes sent and the latency of its answer. One for all the connections (their answerers and
writers tell it); the quotas decide (``core/quotas.py``), this counts and logs."""

from __future__ import annotations

import time
from typing import Any, Final

import structlog
from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.purgatory import Timings
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.server.telemetry.metrics import Metrics

log: Final = structlog.get_logger("pidctl.server")


class Accounting:
    """Counts what each request and answer cost against the quotas and in the metrics, and
    writes the request log's lines."""

    def __init__(self, quotas: Quotas, metrics: Metrics, *, log_requests: bool = False) -> None:
        self.quotas = quotas
        self.metrics = metrics
        # Decided once: building the request log's fields costs on every request otherwise.
        self.log_requests = log_requests
        # Metric children, resolved once: labels() costs a lock and a dict lookup per call.
        self._answered: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}
        self._created: dict[str, Any] = {}  # pidctl_producer_ids_created_total by principal

    @property
    def one_at_a_time(self) -> bool:
        """Whether each request must be accounted for alone (a request or producer-id quota
        throttles at the one that crosses it; the request log has a line each): then the
        idempotent runs are one request long. The readers and answerers are the same."""
        quotas = self.quotas
        return quotas.limits_requests or quotas.limits_producer_ids or self.log_requests

    def refusal(
        self,
        api: str,
        api_key: int,
        subject: str | None,
        creates_producer_ids: bool,
        info: ConnectionInfo,
    ) -> float:
        """Before a request of an API that takes a quota is decided: 0 if it may be; else
        the throttle of its refusal (strict quotas, ``core/quotas.py``: its bucket is
        behind, whichever connection or client id it came by), counted. ``subject``: the
        client id its request quota counts it under (``quota_subject``)."""
        quotas = self.quotas
        if not (quotas.limits_requests or quotas.limits_producer_ids):
            return 0.0
        refused = quotas.refusal(
            api_key, info.principal, subject, creates_producer_ids, time.monotonic()
        )
        if refused:
            self.metrics.quota_refusals.labels(api).inc()
        return refused

    def accounted(
        self,
        api: str,
        version: int,
        error: int,
        created: int,
        refused: float,
        api_key: int,
        subject: str | None,
        client_id: str | None,
        correlation_id: int,
        info: ConnectionInfo,
    ) -> float:
        """What follows the decision of one request, whichever its API: the throttle its
        quotas ask for (KIP-219; 0 for none), counted; the answer counted; the request log's
        line. ``created``: the producer ids it created (for their quota); ``refused``: the
        throttle of a quota's refusal (:meth:`refusal`: nothing was decided, nothing more
        is counted against the quotas); ``subject``: the client id its request quota counts
        it under (``quota_subject``), ``client_id`` the one it sent."""
        delay = refused
        if not refused:
            quotas = self.quotas
            if quotas.limits_requests:
                delay = quotas.request(api_key, info.principal, subject, time.monotonic())
            if created:
                delay = max(delay, self.new_producer_ids(info.principal, created))
        if delay:
            self._throttled(api, delay)
        self.tally(api, version, error, 1)
        if self.log_requests:
            log.debug(
                "request",
                api=api,
                version=version,
                peer=info.peer,
                client_id=client_id,
                correlation_id=correlation_id,
                error=error,
            )
        return delay

    def sent(self, size: int, timings: Timings) -> None:
        """Answers written: their bytes, and each one's latency since its request was
        received (the writers tell it)."""
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

    def new_producer_ids(self, principal: str, count: int) -> float:
        """Count producer ids created for ``principal``; the throttle their quota asks for
        (``producer_ids_rate``), or 0."""
        child = self._created.get(principal)
        if child is None:
            child = self._created[principal] = self.metrics.producer_ids_created.labels(principal)
        child.inc(count)
        if not self.quotas.limits_producer_ids:
            return 0.0
        delay = self.quotas.producer_ids(principal, count, time.monotonic())
        if delay:
            self.metrics.producer_ids_throttled.labels(principal).inc()
            self.metrics.producer_ids_throttle_seconds.labels(principal).inc(delay)
        return delay

    def count(self, api: str, version: int, body: object) -> None:
        """Count one answer of ``api`` at ``version`` (its body's error, if it has one)."""
        self.tally(api, version, getattr(body, "error_code", 0), 1)

    def tally(self, api: str, version: int, error: int, count: int) -> None:
        """Count ``count`` answers of ``api`` at ``version``, all with ``error``."""
        child = self._answered.get((api, version))
        if child is None:
            child = self._answered[api, version] = self.metrics.requests.labels(api, str(version))
        child.inc(count)
        if error:
            name = ErrorCode(error).name.upper()
            self.metrics.errors.labels(api, str(version), name).inc(count)

    def _throttled(self, api: str, seconds: float) -> None:
        self.metrics.throttled.labels(api).inc()
        self.metrics.throttle_seconds.labels(api).inc(seconds)

    def _latency_of(self, api: str) -> Any:
        child = self._latency.get(api)
        if child is None:
            child = self._latency[api] = self.metrics.latency.labels(api)
        return child
