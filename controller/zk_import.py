"""``pidctl import-zk``: KIP-730's upgrade path from ZooKeeper's producer-id block.

Kafka clusters on ZooKeeper keep the last granted block in ``/latest_producer_id_block`` as
``{"version":1,"broker":N,"block_start":"S","block_end":"E"}``. Importing it raises the
high-water mark (of a data dir, or of the etcd counter a fleet shares) to ``E + 1``, so no PID
ZooKeeper ever handed out is granted again. A mark already above that is never lowered.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.kafka import INT64_MAX
from pidctl.controller.core.records import (
    new_cluster_id,
)
from pidctl.controller.server.fleet.etcd import Counter, EtcdCounter

ZNODE = "/latest_producer_id_block"


class ImportRefused(PidctlError):
    """The import would lower a high-water mark, or the znode is not a producer-id block."""


@dataclass(frozen=True, slots=True)
class ZooKeeperBlock:
    broker: int
    block_start: int
    block_end: int

    @property
    def next_producer_id(self) -> int:
        return self.block_end + 1

    @classmethod
    def parse(cls, data: bytes) -> ZooKeeperBlock:
        """Kafka's ProducerIdBlockZNode format, version 1 (ids are JSON strings)."""
        try:
            fields = json.loads(data)
            if fields.get("version") != 1:
                raise ValueError(f"version {fields.get('version')!r}, expected 1")
            block = cls(int(fields["broker"]), int(fields["block_start"]), int(fields["block_end"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ImportRefused(f"not a producer-id block ({e}): {data[:200]!r}") from None
        if not 0 <= block.block_start <= block.block_end < INT64_MAX:
            raise ImportRefused(f"block [{block.block_start}, {block.block_end}] is out of range")
        return block


def read_zookeeper_block(hosts: str, znode: str = ZNODE, timeout_s: float = 10.0) -> ZooKeeperBlock:
    """The block stored in ZooKeeper (kazoo client; read-only)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError

    # kazoo logs its own retries to stderr; the CLI's one line says what went wrong.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    zk = KazooClient(hosts=hosts, timeout=timeout_s)
    try:
        zk.start(timeout=timeout_s)
    except KazooTimeoutError:
        raise ConnectionError(f"ZooKeeper {hosts}: no answer in {timeout_s:g} s") from None
    try:
        data, _ = zk.get(znode)
    except NoNodeError:
        raise ImportRefused(f"ZooKeeper {hosts} has no {znode}") from None
    finally:
        zk.stop()
        zk.close()
    if not data:
        raise ImportRefused(f"{znode} is empty: ZooKeeper never granted a block")
    return ZooKeeperBlock.parse(data)


def check_raise(current: int, wanted: int, what: str) -> bool:
    """Whether to raise ``current`` to ``wanted``: False when it is already there; refused
    when it is above (an import never lowers a high-water mark)."""
    if current > wanted:
        raise ImportRefused(f"{what} is already {current}, above {wanted}: refusing to lower it")
    return current < wanted


def import_into_data_dir(
    data_dir: Path, block: ZooKeeperBlock, origin: str, *, node_id: int, cluster_id: str | None
) -> str:
    """Log a :class:`ProducerIdFloorRaised` (the controller must be stopped: the data dir is
    locked while it runs). Returns what was done, in one line."""
    from pidctl.controller.api.quorum import Now, QuorumController
    from pidctl.controller.log.datadir import lock_data_dir
    from pidctl.controller.log.metalog import MetadataLog
    from pidctl.controller.log.recovery import recover

    lock_fd = lock_data_dir(data_dir, by_operator=True)
    try:
        recovery = recover(data_dir)
        state = recovery.state
        wanted = block.next_producer_id
        if not check_raise(state.next_producer_id, wanted, f"the high-water mark of {data_dir}"):
            return f"{data_dir}: high-water mark already {wanted}; nothing to do"

        async def write() -> None:
            quorum: QuorumController
            log = MetadataLog(
                data_dir,
                state.next_offset,
                recovery.snapshot_offset,
                lambda: quorum.snapshot(),
                reservation=recovery.reservation,
            )
            quorum = QuorumController(state, log)
            async with trio.open_nursery() as nursery:
                await nursery.start(log.run)
                wall = time.time_ns() // 1_000_000
                now = Now(wall, time.monotonic_ns() // 1_000_000)
                # Each record a manager's decision, as start-up's (Kafka's
                # ActivationRecordsGenerator): a log made here begins as `pidctl format`'s.
                if state.cluster_id is None:
                    cluster = state.cluster
                    quorum.apply(
                        cluster.create_cluster(cluster_id or new_cluster_id(), node_id), now
                    )
                    quorum.apply(cluster.controller_started(node_id, "import-zk"), now)
                quorum.apply(state.producer_ids.raise_floor(wanted, origin), now)
                await log.flush()
                nursery.cancel_scope.cancel()

        previous = state.next_producer_id
        trio.run(write)
        return f"{data_dir}: high-water mark raised from {previous} to {wanted} ({origin})"
    finally:
        os.close(lock_fd)


async def import_into_etcd(counter: EtcdCounter, block: ZooKeeperBlock) -> str:
    """Raise the fleet's counter with a compare-and-swap (retried if another writer moved
    it in between, refused if it is above). Returns what was done, in one line."""
    wanted = block.next_producer_id
    seen: Counter = await counter.read()
    where = f"etcd counter {counter.location.counter_key}"
    while True:
        if not check_raise(seen.value, wanted, where):
            return f"{where}: already {wanted}; nothing to do"
        swap = await counter.compare_and_swap(seen, wanted)
        if swap.succeeded:
            return f"{where}: raised from {seen.value} to {wanted} (revision {swap.revision})"
        seen = swap.counter
