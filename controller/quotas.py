"""Request-rate and connection-rate quotas, Kafka style (pure: the caller passes the time).

A request over its quota is still answered, at once, with ``throttle_time_ms`` set; the
server then stops reading that connection for that long (KIP-219), whatever the client
does with the field. A new connection over its source address's rate is accepted only after
the delay (KIP-612). Rates are token buckets: ``rate`` per second with a burst of
``rate * window_s``; a request that takes the bucket below zero is throttled for as long as
the bucket needs to refill to zero (Kafka's quota ``throttleTime``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Buckets not touched for this long are full again and forgotten, bounding memory.
_IDLE_S = 300.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float


class TokenBuckets:
    """One token bucket per key, all with the same rate and burst."""

    def __init__(self, rate: float, window_s: float = 1.0) -> None:
        self.rate = rate
        self.burst = max(1.0, rate * window_s)
        self._buckets: dict[object, _Bucket] = {}
        self._last_sweep_s = 0.0

    def take(self, key: object, now_s: float) -> float:
        """Count one event for ``key``; return how long (seconds) to throttle it, or 0."""
        if self.rate <= 0:
            return 0.0
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self.burst, now_s)
        else:
            elapsed = max(0.0, now_s - bucket.updated_s)
            bucket.tokens = min(self.burst, bucket.tokens + elapsed * self.rate)
            bucket.updated_s = now_s
        bucket.tokens -= 1.0
        self._sweep(now_s)
        return -bucket.tokens / self.rate if bucket.tokens < 0 else 0.0

    def __len__(self) -> int:
        return len(self._buckets)

    def _sweep(self, now_s: float) -> None:
        if now_s - self._last_sweep_s < _IDLE_S:
            return
        self._last_sweep_s = now_s
        idle = [k for k, b in self._buckets.items() if now_s - b.updated_s > _IDLE_S]
        for key in idle:
            del self._buckets[key]


class Quotas:
    """The quotas of one server: per (principal, client id) for the APIs that take a quota,
    and per source address for new connections. A rate of 0 means no quota."""

    def __init__(
        self,
        rates: dict[int, float],
        connection_rate: float = 0.0,
        window_s: float = 1.0,
    ) -> None:
        self._requests = {api: TokenBuckets(rate, window_s) for api, rate in rates.items()}
        self._connections = TokenBuckets(connection_rate, window_s)

    def request(self, api_key: int, principal: str, client_id: str | None, now_s: float) -> float:
        buckets = self._requests.get(api_key)
        if buckets is None:
            return 0.0
        return buckets.take((principal, client_id), now_s)

    def connection(self, address: str, now_s: float) -> float:
        return self._connections.take(address, now_s)
