from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from hypothesis import settings

from ops.testing.coordination import EtcdProcess
from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess

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


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[EtcdProcess, Path]]:
    """etcd serving TLS only (a trustme certificate for 127.0.0.1), and its CA file."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with EtcdProcess(tmp_path / "tls-etcd", tls=(cert_file, key_file)) as proc:
        yield proc, ca_file


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaNode]:
    """A real Apache Kafka node (broker and KRaft controller) shared by a test process's
    tests; tests that change its state use their own topics and ids."""
    with KafkaNode() as node:
        yield node
