"""Request-rate, new-producer-id and connection-rate quotas, Kafka style (pure: the caller
passes the time).

Rates are token buckets: ``rate`` per second with a burst of ``rate * window_s``. The quotas
on requests and on new producer ids are *strict*, as KIP-599's controller mutation quota
(Kafka's ``StrictControllerMutationQuota``): a request that finds its bucket behind (below
zero) is refused, and not counted; one that finds it at or above zero is decided and
counted, whatever it takes (a job's block of 1,000 producer ids may take it far below), and
answered with ``throttle_time_ms`` set to the time until the bucket is back at zero; the
server then reads nothing more from that connection for that long (KIP-219). So a client
that waits as it is told is never refused, and one that does not (a new connection, a new
client id, a second client of the same principal) is refused until the bucket has refilled:
over any span, a key gets at most ``rate`` times the span, plus one burst, plus one request.
The deficit is bounded by one request, never by how many were ignored, so an honest client
sharing a bucket with an abusive one waits at most that long (Kafka bounds a request
quota's throttle by one window: ``ClientRequestQuotaManager``).

The throttles answered on the wire are decided in whole milliseconds, as Kafka's
``QuotaUtils.throttleTime`` rounds them (``Math.round``) before its ``throttleTimeMs > 0``
check: under half a millisecond is no throttle, neither in the answer nor in the metrics,
and a bucket less than half a millisecond behind refuses nothing (a connection muted for a
rounded throttle is never refused for the rounding).

A new connection over its source address's rate is accepted only after the delay (KIP-612).

A client chooses its client id, so the buckets keyed by it are bounded
(:class:`TokenBuckets`' ``max_buckets``): a client id is kept as its hash, and once the
table is full, a key whose least recently used bucket is still in use counts in its
principal's overflow bucket, shared by every such client id of the principal, so that new
client ids gain nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Final

from pidctl.controller.core.producer_ids import JOB_BROKER_EPOCH, JOB_BROKER_ID
from pidctl.protocol.apis import ApiKey

#: Default of the ``quota_max_buckets`` setting: buckets kept per table. A bucket is ~250
#: bytes (its key holds a client id's hash, not the client id), so a full table is a few MB.
DEFAULT_MAX_BUCKETS: Final = 10_000
#: A bucket less than this far behind (seconds) is not behind: the throttles are whole
#: milliseconds, rounded (see the module's docstring).
_ROUNDING_S: Final = 0.0005


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float
    #: The rate it was last counted at (per-key overrides give keys different rates).
    rate: float


class TokenBuckets:
    """One token bucket per key, at most ``max_buckets`` of them (least recently used
    first out); the rate (events per second) is given with each event, so keys may have
    different quotas. A rate of 0 means no quota."""

    def __init__(
        self, rate: float = 0.0, window_s: float = 1.0, max_buckets: int = DEFAULT_MAX_BUCKETS
    ) -> None:
        self.rate = rate
        self.window_s = window_s
        self.max_buckets = max_buckets
        # Least recently used first: a bucket touched moves to the end.
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def behind(self, key: Hashable, now_s: float, rate: float | None = None) -> float:
        """How long (seconds) until ``key``'s bucket is back at zero; 0 if it is not behind.
        Changes nothing."""
        rate = self.rate if rate is None else rate
        bucket = self._buckets.get(key)
        if rate <= 0 or bucket is None:
            return 0.0
        tokens = min(self._burst(rate), bucket.tokens + max(0.0, now_s - bucket.updated_s) * rate)
        return -tokens / rate if tokens < 0 else 0.0

    def take(
        self,
        key: Hashable,
        now_s: float,
        rate: float | None = None,
        count: float = 1.0,
    ) -> float:
        """Count ``count`` events for ``key``; return how long (seconds) until its bucket is
        back at zero (the throttle), or 0."""
        rate = self.rate if rate is None else rate
        if rate <= 0:
            return 0.0
        burst = self._burst(rate)
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            self._forget_full(now_s)
            bucket = buckets[key] = _Bucket(burst, now_s, rate)
        else:
            buckets.move_to_end(key)
            elapsed = max(0.0, now_s - bucket.updated_s)
            bucket.tokens = min(burst, bucket.tokens + elapsed * rate)
            bucket.updated_s = now_s
            bucket.rate = rate
        bucket.tokens -= count
        return -bucket.tokens / rate if bucket.tokens < 0 else 0.0

    def room_for(self, key: Hashable, now_s: float) -> bool:
        """Whether ``key`` has a bucket, or one can be made for it: the table is not full,
        or buckets full again make room (see :meth:`_forget_full`)."""
        buckets = self._buckets
        if key in buckets or len(buckets) < self.max_buckets:
            return True
        self._forget_full(now_s)
        return len(buckets) < self.max_buckets

    def __len__(self) -> int:
        return len(self._buckets)

    def _burst(self, rate: float) -> float:
        return max(1.0, rate * self.window_s)

    def _forget_full(self, now_s: float) -> None:
        """Forget the least recently used buckets that are full again, oldest first, up to
        the first still in use: a new bucket starts full, so nothing is lost, and the table
        holds only the keys that used their quota lately. (A bucket in deficit is kept
        however long ago it was used: forgetting it would forgive the deficit.)"""
        buckets = self._buckets
        while buckets:
            key, bucket = next(iter(buckets.items()))
            rate = bucket.rate
            if bucket.tokens + (now_s - bucket.updated_s) * rate < self._burst(rate):
                break
            del buckets[key]


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
NEW_PRODUCER_IDS: Final = -1
#: The client id of a principal's overflow bucket (no client id is a tuple).
_OVERFLOW: Final = ("overflow",)
_INIT_PRODUCER_ID: Final = int(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS: Final = int(ApiKey.ALLOCATE_PRODUCER_IDS)


def quota_subject(api_key: int, client_id: str | None, body: Any) -> tuple[str | None, bool]:
    """For a request: the client id its request quota counts it under, and whether it may
    create producer ids (InitProducerId, and a job's AllocateProducerIds: BrokerId -1 and
    BrokerEpoch -1; a broker's blocks are the cluster's, not a producer's). A job names
    every block in its client id (``core/jobs.py``), so its requests count under its
    principal alone (None)."""
    if api_key == _INIT_PRODUCER_ID:
        return client_id, True
    if api_key == _ALLOCATE_PRODUCER_IDS:
        job = body.broker_id == JOB_BROKER_ID and body.broker_epoch == JOB_BROKER_EPOCH
        return (None, True) if job else (client_id, False)
    return client_id, False


class Quotas:
    """The quotas of one server: per (principal, client id) for the APIs that take a
    quota, per principal for new producer ids, and per source address for new
    connections. A rate of 0 means no quota.

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
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        self._defaults = dict(rates)
        self._overrides = {(o.api_key, o.principal, o.client_id): o.rate for o in overrides}
        #: Whether any API has a request quota (a default or an override above 0): without
        #: one, :meth:`request` never throttles and the request path need not ask.
        self.limits_requests = any(
            rate > 0 for rate in (*self._defaults.values(), *self._overrides.values())
        )
        self._requests = TokenBuckets(0.0, window_s, max_buckets)
        # The overflow buckets, one per (API, principal): as many as principals, who are
        # authenticated (and so not a client's to multiply).
        self._overflow = TokenBuckets(0.0, window_s, max_buckets=2**62)
        self._connections = TokenBuckets(connection_rate, window_s, max_buckets)
        # KIP-936's producer_ids_rate (never shipped by Kafka): per principal only.
        self._producer_ids = TokenBuckets(producer_ids_rate, window_s, max_buckets=2**62)
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

    def refusal(
        self,
        api_key: int,
        principal: str,
        client_id: str | None,
        creates_producer_ids: bool,
        now_s: float,
    ) -> float:
        """Before a request is decided: 0 if it may be; else the throttle of its refusal
        (seconds, whole milliseconds): its request quota's bucket is behind, or (a request
        that may create producer ids) its principal's bucket of new producer ids is."""
        behind = 0.0
        rate = self.rate(api_key, principal, client_id)
        if rate > 0:
            table, key = self._request_bucket(api_key, principal, client_id, now_s)
            behind = table.behind(key, now_s, rate)
        if creates_producer_ids and self.limits_producer_ids:
            rate = self._producer_ids_rate(principal)
            behind = max(behind, self._producer_ids.behind(principal, now_s, rate))
        return _whole_ms(behind) if behind > _ROUNDING_S else 0.0

    def request(self, api_key: int, principal: str, client_id: str | None, now_s: float) -> float:
        """Count a request decided; how long to throttle its connection (whole ms), or 0."""
        rate = self.rate(api_key, principal, client_id)
        if rate <= 0:
            return 0.0
        table, key = self._request_bucket(api_key, principal, client_id, now_s)
        return _whole_ms(table.take(key, now_s, rate))

    def connection(self, address: str, now_s: float) -> float:
        """Count a new connection from ``address``; how long to delay it (KIP-612), or 0.
        Once the table is full of addresses in use (a client may have many: IPv6), a new
        address counts in one bucket shared by all such addresses."""
        table = self._connections
        return table.take(address if table.room_for(address, now_s) else _OVERFLOW, now_s)

    def producer_ids(self, principal: str, count: int, now_s: float) -> float:
        """Count ``count`` producer ids just created for ``principal`` (an idempotent
        InitProducerId, a transactional id's first use or rotation, a job's block); how
        long to throttle the connection, or 0. The principal's override applies, else the
        default rate."""
        rate = self._producer_ids_rate(principal)
        return _whole_ms(self._producer_ids.take(principal, now_s, rate, count))

    @property
    def request_buckets(self) -> int:
        """Buckets of request quotas kept now (bounded by ``max_buckets``, plus one overflow
        bucket per API and principal that needed one)."""
        return len(self._requests) + len(self._overflow)

    def _producer_ids_rate(self, principal: str) -> float:
        return self._producer_ids_rates.get(principal, self._producer_ids.rate)

    def _request_bucket(
        self, api_key: int, principal: str, client_id: str | None, now_s: float
    ) -> tuple[TokenBuckets, Hashable]:
        """The table and key of a request's bucket: its own, or, once the table is full
        of buckets in use, its principal's overflow bucket."""
        # The client id's hash, not the client id: a bucket's size does not depend on what
        # a client sends (Python's string hash is keyed per process: no client can aim two
        # client ids at one bucket).
        key = (api_key, principal, hash(client_id))
        if self._requests.room_for(key, now_s):
            return self._requests, key
        return self._overflow, (api_key, principal, _OVERFLOW)


def _whole_ms(seconds: float) -> float:
    """``seconds`` rounded to a whole millisecond as Java's ``Math.round`` rounds (half up)."""
    return math.floor(seconds * 1000 + 0.5) / 1000
