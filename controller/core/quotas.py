"""Request-rate and connection-rate quotas, Kafka style (pure: the caller passes the time).

A request over its quota is still answered, at once, with ``throttle_time_ms`` set; the
server then stops reading that connection for that long (KIP-219), whatever the client
does with the field. A new connection over its source address's rate is accepted only after
the delay (KIP-612). Rates are token buckets: ``rate`` per second with a burst of
``rate * window_s``; a request that takes the bucket below zero is throttled for as long as
the bucket needs to refill to zero (Kafka's quota ``throttleTime``). The throttles answered on
the wire are decided in whole milliseconds, as Kafka's ``QuotaUtils.throttleTime`` rounds
them (``Math.round``) before its ``throttleTimeMs > 0`` check: under half a millisecond is
no throttle, neither in the answer nor in the metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Buckets not touched for this long are full again and forgotten, bounding memory.
_IDLE_S = 300.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float


class TokenBuckets:
    """One token bucket per key; the rate (events per second) is given with each event, so
    keys may have different quotas. A rate of 0 means no quota."""

    def __init__(self, rate: float = 0.0, window_s: float = 1.0) -> None:
        self.rate = rate
        self.window_s = window_s
        self._buckets: dict[object, _Bucket] = {}
        self._last_sweep_s = 0.0

    def take(
        self, key: object, now_s: float, rate: float | None = None, count: float = 1.0
    ) -> float:
        """Count ``count`` events for ``key``; return how long (seconds) to throttle it, or 0."""
        rate = self.rate if rate is None else rate
        if rate <= 0:
            return 0.0
        burst = max(1.0, rate * self.window_s)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(burst, now_s)
        else:
            elapsed = max(0.0, now_s - bucket.updated_s)
            bucket.tokens = min(burst, bucket.tokens + elapsed * rate)
            bucket.updated_s = now_s
        bucket.tokens -= count
        self._sweep(now_s)
        return -bucket.tokens / rate if bucket.tokens < 0 else 0.0

    def __len__(self) -> int:
        return len(self._buckets)

    def _sweep(self, now_s: float) -> None:
        if now_s - self._last_sweep_s < _IDLE_S:
            return
        self._last_sweep_s = now_s
        idle = [k for k, b in self._buckets.items() if now_s - b.updated_s > _IDLE_S]
        for key in idle:
            del self._buckets[key]


@dataclass(frozen=True, slots=True)
class QuotaOverride:
    """A rate for one principal and/or client id (None: any), for one API (or, with
    :data:`NEW_PRODUCER_IDS`, for the producer ids a principal's requests create)."""

    api_key: int
    rate: float
    principal: str | None = None
    client_id: str | None = None


#: The ``api_key`` of a :class:`QuotaOverride` of ``producer_ids_rate``: not an API, the
#: producer ids created for a principal by whichever API.
NEW_PRODUCER_IDS = -1


class Quotas:
    """The quotas of one server: per (principal, client id) for the APIs that take a quota,
    and per source address for new connections. A rate of 0 means no quota.

    The rate of a (principal, client id) pair is, as in Kafka, the most specific that
    applies: an override for both, then for the principal, then for the client id, then the
    default for the API."""

    def __init__(
        self,
        rates: dict[int, float],
        connection_rate: float = 0.0,
        window_s: float = 1.0,
        overrides: tuple[QuotaOverride, ...] = (),
        producer_ids_rate: float = 0.0,
    ) -> None:
        self._defaults = dict(rates)
        self._overrides = {(o.api_key, o.principal, o.client_id): o.rate for o in overrides}
        #: Whether any API has a request quota (a default or an override above 0): without
        #: one, :meth:`request` never throttles and the request path need not ask.
        self.limits_requests = any(
            rate > 0 for rate in (*self._defaults.values(), *self._overrides.values())
        )
        self._requests = TokenBuckets(0.0, window_s)
        self._connections = TokenBuckets(connection_rate, window_s)
        # KIP-936's producer_ids_rate (never shipped by Kafka): per principal only.
        self._producer_ids = TokenBuckets(producer_ids_rate, window_s)
        self._producer_ids_rates = {
            o.principal: o.rate
            for o in overrides
            if o.api_key == NEW_PRODUCER_IDS and o.principal is not None
        }
        #: Whether any principal has a quota on new producer ids (else none is counted).
        self.limits_producer_ids = producer_ids_rate > 0 or any(
            rate > 0 for rate in self._producer_ids_rates.values()
        )

    def rate(self, api_key: int, principal: str, client_id: str | None) -> float:
        for key in (
            (api_key, principal, client_id),
            (api_key, principal, None),
            (api_key, None, client_id),
        ):
            if key in self._overrides:
                return self._overrides[key]
        return self._defaults.get(api_key, 0.0)

    def request(self, api_key: int, principal: str, client_id: str | None, now_s: float) -> float:
        rate = self.rate(api_key, principal, client_id)
        return _whole_ms(self._requests.take((api_key, principal, client_id), now_s, rate))

    def connection(self, address: str, now_s: float) -> float:
        return self._connections.take(address, now_s)

    def producer_ids(self, principal: str, count: int, now_s: float) -> float:
        """Count ``count`` producer ids just created for ``principal`` (an idempotent
        InitProducerId, a transactional id's first use or rotation); how long to throttle
        the connection, or 0. The principal's override applies, else the default rate."""
        rate = self._producer_ids_rates.get(principal, self._producer_ids.rate)
        return _whole_ms(self._producer_ids.take(principal, now_s, rate, count))


def _whole_ms(seconds: float) -> float:
    """``seconds`` rounded to a whole millisecond as Java's ``Math.round`` rounds (half up)."""
    return math.floor(seconds * 1000 + 0.5) / 1000
