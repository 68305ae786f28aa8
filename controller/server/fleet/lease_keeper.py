"""The task that keeps a lease from etcd ahead of demand (the I/O half of the leases that
``core/producer_ids.py`` decides).

It sleeps until a grant brings what is left below the prefetch threshold, then takes the next
lease with a compare-and-swap on the shared counter, records it in the metadata log, and
waits for the record to be durable before it counts it as taken. While etcd is unreachable
the controller keeps granting from what it holds; once that is used up AllocateProducerIds
and InitProducerId answer retriable errors until a lease arrives (the back-off below).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Awaitable, Callable

import structlog
import trio

from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.pid_leases import ProducerIdSpaceExhausted
from pidctl.controller.core.records import ProducerIdsGranted, Record
from pidctl.controller.server.fleet.etcd import (
    Counter,
    EtcdCounter,
    EtcdRefused,
    EtcdUnavailable,
)
from pidctl.controller.settings import Settings
from pidctl.protocol.addresses import EtcdLocation

log = structlog.get_logger("pidctl.leases")

#: Back-off between attempts while etcd does not answer, doubling up to the maximum.
RETRY_MIN_S = 0.05
RETRY_MAX_S = 2.0
#: While the counter is below what was seen (corruption), it is read again this often.
REGRESSION_RETRY_S = 1.0
#: A refused lease is logged at most once per this many seconds (and when it changes).
REGRESSION_LOG_INTERVAL_S = 30.0


class CounterWentBack(Exception):
    """The shared counter is below the highest lease this controller has seen: it was
    deleted or reset. Leasing from it would hand out ranges other controllers hold."""

    def __init__(self, counter: int, highest: int) -> None:
        self.counter = counter
        self.highest = highest
        super().__init__(
            f"the etcd counter says {counter}, below {highest}, the highest lease seen: it was "
            "deleted or set back; refusing to lease until it is at least that again"
        )


def etcd_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """TLS to etcd (``etcds://``): its CA, and a client certificate if one is set."""
    location = settings.etcd_location
    if location is None or not location.tls:
        return None
    context = ssl.create_default_context(cafile=settings.etcd_cafile or None)
    if settings.etcd_certfile:
        context.load_cert_chain(settings.etcd_certfile, settings.etcd_keyfile)
    return context


def etcd_counter(
    settings: Settings,
    on_request: Callable[[str, float, bool], None] | None = None,
    *,
    leases: bool = False,
) -> EtcdCounter:
    """The settings' etcd counter; ``leases``: a controller leasing from it, which records
    each lease under its node id (``pidctl import-zk`` records none)."""
    location = settings.etcd_location
    assert location is not None
    return EtcdCounter(
        location,
        ssl_context=etcd_ssl_context(settings),
        username=settings.etcd_username,
        password=settings.etcd_password,
        timeout_s=settings.etcd_timeout_ms / 1000,
        on_request=on_request,
        member=str(settings.node_id) if leases else None,
    )


class GrantBell:
    """Rung by each grant the quorum controller applies (:meth:`applied`, one of its
    observers); the lease keeper waits for it. Built before both, so that each is handed it
    at construction."""

    def __init__(self) -> None:
        self._rung = trio.Event()

    def applied(self, offset: int, record: Record) -> None:
        """An observer of the quorum controller: each grant rings."""
        if isinstance(record, ProducerIdsGranted):
            self.ring()

    def ring(self) -> None:
        self._rung.set()

    def rearm(self) -> None:
        """Forget the rings so far: :meth:`wait` waits for the next."""
        self._rung = trio.Event()

    async def wait(self) -> None:
        await self._rung.wait()


class LeaseKeeper:
    """Takes leases for one controller; each grant its quorum controller applies rings its
    :class:`GrantBell` (``bell``: one of the quorum controller's observers)."""

    def __init__(
        self,
        counter: EtcdCounter,
        quorum: QuorumController,
        wait_durable: Callable[[int], Awaitable[None]],
        now: Callable[[], Now],
        bell: GrantBell,
        *,
        lease_size: int,
        prefetch_ratio: float,
        on_lease: Callable[[int], None] = lambda size: None,
        on_counter_went_back: Callable[[CounterWentBack | None], None] = lambda error: None,
    ) -> None:
        self.counter = counter
        self.quorum = quorum
        self._wait_durable = wait_durable
        self._now = now
        self.lease_size = lease_size
        self.prefetch_ratio = prefetch_ratio
        self._on_lease = on_lease
        self._on_counter_went_back = on_counter_went_back
        self.bell = bell
        self._last_seen: Counter | None = None
        #: The highest counter value seen from etcd in this process.
        self._highest_seen = 0
        #: While the counter is below it: the refusal, and when it was last logged.
        self._refused: CounterWentBack | None = None
        self._refusal_logged = 0.0
        #: Set once a lease was taken by this process.
        self.leased = trio.Event()

    @property
    def location(self) -> EtcdLocation:
        return self.counter.location

    def wanted(self) -> bool:
        return self.quorum.state.leases.wants_lease(self.lease_size, self.prefetch_ratio)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        delay = RETRY_MIN_S
        out_since: float | None = None
        while True:
            if not self.wanted():
                self.bell.rearm()
                if not self.wanted():
                    await self.bell.wait()
                continue
            try:
                await self.take_lease()
            except CounterWentBack as e:
                await self._refuse(e)
                continue
            except (EtcdUnavailable, EtcdRefused) as e:
                left = self.quorum.state.leases.remaining()
                if left == 0 and out_since is None:
                    out_since = time.monotonic()
                    log.error(
                        "producer ids exhausted: no lease left and etcd does not answer;"
                        " refusing new producer ids until it does",
                        source=str(self.location),
                        error=str(e),
                    )
                else:
                    log.warning(
                        "etcd unavailable",
                        source=str(self.location),
                        error=str(e),
                        lease_remaining=left,
                        retry_in_s=delay,
                    )
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            except ProducerIdSpaceExhausted as e:
                log.error("producer id space exhausted", error=str(e))
                await trio.sleep_forever()
            if out_since is not None:
                log.info(
                    "producer ids available again", outage_s=round(time.monotonic() - out_since, 3)
                )
                out_since = None
            if self._refused is not None:
                log.warning("etcd counter at or above the highest lease seen again; leasing")
                self._refused = None
                self._on_counter_went_back(None)
            delay = RETRY_MIN_S

    async def _refuse(self, error: CounterWentBack) -> None:
        """No lease while the counter went back: counted and reported (``/readyz`` fails),
        logged at once and then at most every ``REGRESSION_LOG_INTERVAL_S``; the counter is
        read again (not the cached value) until an operator puts it back."""
        moment = time.monotonic()
        changed = self._refused is None or self._refused.counter != error.counter
        if changed or moment - self._refusal_logged >= REGRESSION_LOG_INTERVAL_S:
            log.error(
                "etcd counter went back",
                source=str(self.location),
                counter=error.counter,
                highest_lease_seen=error.highest,
                lease_remaining=self.quorum.state.leases.remaining(),
                error=str(error),
            )
            self._refusal_logged = moment
        self._refused = error
        self._on_counter_went_back(error)
        self._last_seen = None
        await trio.sleep(REGRESSION_RETRY_S)

    def _check(self, seen: Counter) -> None:
        """A counter below the highest lease seen (in this log, from etcd in this process, or
        recorded in etcd by any controller of the fleet beside the counter) went back:
        :class:`CounterWentBack`."""
        highest = max(self._highest_seen, self.quorum.state.leases.highest_lease_end, seen.leased)
        if seen.value < highest:
            raise CounterWentBack(seen.value, highest)
        self._highest_seen = max(self._highest_seen, seen.value)

    async def take_lease(self) -> tuple[int, int]:
        """One lease: compare-and-swap until it succeeds, then log it and wait until durable.
        Raises :class:`CounterWentBack` rather than lease from a counter that went back."""
        seen = self._last_seen if self._last_seen is not None else await self.counter.read()
        while True:
            self._check(seen)
            first, end = self.quorum.state.leases.lease_bounds(seen.value, self.lease_size)
            swap = await self.counter.compare_and_swap(seen, end)
            seen = swap.counter
            self._last_seen = seen
            if swap.succeeded:
                self._highest_seen = max(self._highest_seen, end)
                break
        lease = self.quorum.state.leases.lease(first, end, str(self.location), swap.revision)
        offset = self.quorum.apply(lease, self._now())[1]
        await self._wait_durable(offset)
        self._on_lease(end - first)
        self.leased.set()
        log.info(
            "lease taken", first_producer_id=first, next_producer_id=end, revision=swap.revision
        )
        return first, end
