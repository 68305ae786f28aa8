from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ops.coordination import EtcdProcess
from ops.serverproc import ServerProcess

# Properties here are about records and bytes, not time: no per-example deadline, which
# only flakes on a busy 2-core CI machine.
settings.register_profile("pidctl", deadline=None)
settings.load_profile("pidctl")


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
