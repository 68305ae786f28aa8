"""Test helpers over the wire: request builders plus reading the cluster id from a data dir."""

from __future__ import annotations

from pathlib import Path

from ops.testing.serverproc import stored_cluster_id
from pidctl.client import SyncClient
from pidctl.protocol.requests import allocate, heartbeat, registration, unregister

__all__ = [
    "allocate",
    "assert_pids_outside_blocks",
    "cluster_id_of",
    "heartbeat",
    "register",
    "registration",
    "unregister",
]


def cluster_id_of(data_dir: Path) -> str:
    """The cluster id the server stored (read-only; safe while it runs)."""
    return stored_cluster_id(Path(data_dir))


def register(client: SyncClient, broker_id: int, cluster_id: str) -> int:
    """Register a new incarnation and return its epoch."""
    response = client.request(registration(broker_id, cluster_id))
    assert response.error_code == 0, response
    return int(response.broker_epoch)


def assert_pids_outside_blocks(pids: list[int], blocks: list[tuple[int, int]]) -> None:
    """No PID handed to a producer twice, and none inside a block granted to a broker."""
    assert len(set(pids)) == len(pids)
    for start, length in blocks:
        assert not any(start <= pid < start + length for pid in pids), (start, length)
