from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.coordination import EtcdProcess
from ops.serverproc import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real `pidctl serve` on a loopback port with a fresh data dir."""
    with ServerProcess(tmp_path / "data") as proc:
        yield proc


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A real single-member etcd (Debian's etcd-server) on loopback ports."""
    with EtcdProcess(tmp_path / "etcd") as proc:
        yield proc
