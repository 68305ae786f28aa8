"""A broker's life with the controller: register, heartbeat, re-register when told the
epoch is stale, ask for producer-id blocks, shut down cleanly. A trio task, with a thin
synchronous wrapper (:class:`SyncBroker`) for code that is not async."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import structlog
import trio
from kio.schema.errors import ErrorCode

from pidctl.broker.pid_manager import AllocationRefused, ProducerIdManager
from pidctl.client import TrioClient
from pidctl.protocol import requests

log = structlog.get_logger("pidctl.broker")

#: Kafka's broker.heartbeat.interval.ms default.
HEARTBEAT_INTERVAL_S = 2.0
RECONNECT_BACKOFF_S = 0.2


class BrokerLifecycle:
    """Registration and heartbeats of one broker incarnation against ``bootstrap``."""

    def __init__(
        self,
        bootstrap: str,
        broker_id: int,
        *,
        cluster_id: str | None = None,
        listeners: tuple[str, ...] = (),
        rack: str | None = None,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.listeners = listeners
        self.rack = rack
        self.heartbeat_interval_s = heartbeat_interval_s
        self.incarnation = uuid.uuid4()
        self.epoch: int | None = None
        self.registrations = 0
        self._client: TrioClient | None = None
        self._registered = trio.Event()

    async def _connection(self) -> TrioClient:
        if self._client is None:
            self._client = await TrioClient.connect(
                self.bootstrap, client_id=f"broker-{self.broker_id}"
            )
        return self._client

    async def _call(self, body: Any) -> Any:
        try:
            return await (await self._connection()).request(body)
        except (OSError, ConnectionError, trio.BrokenResourceError, trio.ClosedResourceError):
            await self._drop()
            raise ConnectionError("controller connection lost") from None

    async def _drop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await trio.aclose_forcefully(client._stream)

    async def register(self) -> int:
        if self.cluster_id is None:
            self.cluster_id = (await self._call(requests.metadata([]))).cluster_id
        response = await self._call(
            requests.registration(
                self.broker_id,
                self.cluster_id or "",
                self.incarnation,
                listeners=self.listeners,
                rack=self.rack,
            )
        )
        if response.error_code:
            raise AllocationRefused(f"registration refused: {response.error_code.name}")
        self.epoch = int(response.broker_epoch)
        self.registrations += 1
        self._registered.set()
        log.info("registered", broker_id=self.broker_id, epoch=self.epoch)
        return self.epoch

    async def _reregister(self) -> None:
        """Told our epoch is stale: a new incarnation, as a restarted broker would be."""
        self.incarnation = uuid.uuid4()
        self.epoch = None
        self._registered = trio.Event()

    async def allocate(self) -> tuple[int, int]:
        """One AllocateProducerIds with the current epoch: (first producer id, length)."""
        await self._registered.wait()
        response = await self._call(requests.allocate(self.broker_id, self.epoch or -1))
        if response.error_code == ErrorCode.stale_broker_epoch:
            await self._reregister()
        if response.error_code:
            raise AllocationRefused(f"AllocateProducerIds: {response.error_code.name}")
        return int(response.producer_id_start), int(response.producer_id_len)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat until cancelled; reconnect and re-register as needed."""
        started = False
        while True:
            try:
                if self.epoch is None:
                    await self.register()
                    if not started:
                        started = True
                        task_status.started()
                beat = await self._call(requests.heartbeat(self.broker_id, self.epoch or -1))
                if beat.error_code == ErrorCode.stale_broker_epoch:
                    await self._reregister()
                    continue
                await trio.sleep(self.heartbeat_interval_s)
            except (ConnectionError, OSError, AllocationRefused) as e:
                log.warning("controller unavailable", broker_id=self.broker_id, error=str(e))
                await trio.sleep(RECONNECT_BACKOFF_S)

    async def shutdown(self) -> None:
        """Controlled shutdown: tell the controller, then close the connection."""
        if self.epoch is not None:
            with contextlib.suppress(ConnectionError):
                await self._call(
                    requests.heartbeat(self.broker_id, self.epoch, want_shut_down=True)
                )
        await self._drop()


class SyncBroker:
    """The lifecycle and a ProducerIdManager on a trio loop in a thread of their own, for
    code that is not async. :meth:`generate_producer_id` never waits for the controller."""

    def __init__(self, bootstrap: str, broker_id: int, **manager_options: Any) -> None:
        """Start registering ``broker_id`` with the controller at ``bootstrap``."""
        self.lifecycle = BrokerLifecycle(bootstrap, broker_id)
        self.manager = ProducerIdManager(self.lifecycle.allocate, **manager_options)
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: Callable[[], None] | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the broker loop did not start")

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._stop = nursery.cancel_scope.cancel
            nursery.start_soon(self.lifecycle.run)
            nursery.start_soon(self.manager.run)
            self._ready.set()
            await trio.sleep_forever()

    def generate_producer_id(self) -> int:
        """The next PID; raises CoordinatorLoadInProgress when none is ready (retry)."""
        return trio.from_thread.run_sync(self.manager.generate, trio_token=self._token)

    def close(self) -> None:
        """Controlled shutdown, then stop the loop."""
        trio.from_thread.run(self.lifecycle.shutdown, trio_token=self._token)
        if self._stop is not None:
            trio.from_thread.run_sync(self._stop, trio_token=self._token)
        self._thread.join(10)
