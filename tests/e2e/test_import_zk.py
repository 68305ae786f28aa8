"""`pidctl import-zk` against a real ZooKeeper (Debian's package, kazoo as the client)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from ops.testing.coordination import EtcdProcess, ZooKeeperProcess
from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests

ZNODE = "/latest_producer_id_block"


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperProcess]:
    with ZooKeeperProcess(tmp_path_factory.mktemp("zk")) as zk:
        yield zk


def _write_block(zk: ZooKeeperProcess, data: bytes) -> None:
    client = KazooClient(hosts=zk.hosts)
    client.start(timeout=30)
    client.ensure_path(ZNODE)
    client.set(ZNODE, data)
    client.stop()
    client.close()


def _block(broker: int, start: int, end: int) -> bytes:
    # The seed's format (Kafka's ProducerIdBlockZNode, version 1): ids as JSON strings.
    return json.dumps(
        {"version": 1, "broker": broker, "block_start": str(start), "block_end": str(end)}
    ).encode()


def _import(zk: ZooKeeperProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pidctl.controller.cli", "import-zk", "--zookeeper", zk.hosts]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def _first_block(server: ServerProcess) -> int:
    with SyncClient(server.bootstrap) as client:
        response = client.request(requests.allocate(-1, -1))
    assert response.error_code == 0
    return int(response.producer_id_start)


def test_import_into_a_data_dir(zookeeper: ZooKeeperProcess, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with ServerProcess(data_dir) as server:
        assert _first_block(server) == 0  # an existing controller with history
        # While it runs, the data dir is locked: one clear line, nothing written.
        _write_block(zookeeper, _block(3, 5_000_000, 5_000_999))
        busy = _import(zookeeper, "--data-dir", str(data_dir))
        assert busy.returncode == 1
        assert busy.stderr.strip() == f"pidctl: {data_dir} is in use: stop the controller first"
        # Stopped as the line says (SIGTERM: its reservation released), so the import alone
        # decides where grants go on; after a crash a start would skip to the reservation.
        assert server.terminate() == 0
    done = _import(zookeeper, "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    assert "broker 3, block 5000000..5000999" in done.stdout
    assert "raised from 1000 to 5001000" in done.stdout
    again = _import(zookeeper, "--data-dir", str(data_dir))  # the same value: nothing to do
    assert again.returncode == 0 and "nothing to do" in again.stdout
    with ServerProcess(data_dir) as server:
        assert _first_block(server) == 5_001_000  # strictly above ZooKeeper's last block
        server.terminate()  # a clean stop: the next start goes on where this one stopped
    dump = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "log",
            "dump",
            "--data-dir",
            str(data_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    floors = [json.loads(line) for line in dump.stdout.splitlines() if "FloorRaised" in line]
    assert [f["next_producer_id"] for f in floors] == [5_001_000]
    # Once the controller granted above it, the same block is lower: refused, log unchanged.
    assert "refusing to lower it" in _import(zookeeper, "--data-dir", str(data_dir)).stderr
    _write_block(zookeeper, _block(1, 2000, 2999))
    lower = _import(zookeeper, "--data-dir", str(data_dir))
    assert lower.returncode == 1
    assert "refusing to lower it" in lower.stderr and len(lower.stderr.splitlines()) == 1
    with ServerProcess(data_dir) as server:
        assert _first_block(server) == 5_002_000


def test_import_into_a_fresh_data_dir_then_serve(
    zookeeper: ZooKeeperProcess, tmp_path: Path
) -> None:
    _write_block(zookeeper, _block(2, 7000, 7999))
    data_dir = tmp_path / "fresh"
    done = _import(zookeeper, "--data-dir", str(data_dir), "--cluster-id", "migratedCluster00001")
    assert done.returncode == 0, done.stderr
    with ServerProcess(data_dir, "--cluster-id", "migratedCluster00001") as server:
        assert _first_block(server) == 8000
        with SyncClient(server.bootstrap) as client:
            init = client.request(requests.init_producer_id())
        assert init.error_code == 0 and init.producer_id >= 8000


def test_import_into_etcd(zookeeper: ZooKeeperProcess, etcd: EtcdProcess, tmp_path: Path) -> None:
    _write_block(zookeeper, _block(4, 90_000, 90_999))
    source = etcd.pid_source()
    done = _import(zookeeper, "--pid-source", source)
    assert done.returncode == 0, done.stderr
    assert etcd.counter() == 91_000
    with ServerProcess(tmp_path / "c1", "--pid-source", source) as server:
        assert _first_block(server) == 91_000
    _write_block(zookeeper, _block(4, 10, 1009))
    lower = _import(zookeeper, "--pid-source", source)
    assert lower.returncode == 1 and "refusing to lower it" in lower.stderr
    assert etcd.counter() == 91_000 + 1_000_000  # the lease the controller took


def test_bad_input_gets_one_line(zookeeper: ZooKeeperProcess, tmp_path: Path) -> None:
    _write_block(zookeeper, b'{"version":2,"broker":1,"block_start":"0","block_end":"9"}')
    result = _import(zookeeper, "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 1
    assert result.stderr.startswith("pidctl: not a producer-id block (version 2, expected 1)")
    _write_block(zookeeper, b"")
    result = _import(zookeeper, "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 1 and "never granted a block" in result.stderr
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").glob("*.log"))


def test_unreachable_zookeeper_is_one_line(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pidctl.controller.cli",
        "import-zk",
        "--zookeeper",
        "127.0.0.1:1",
        "--timeout",
        "1",
        "--data-dir",
        str(tmp_path / "d"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "pidctl: ZooKeeper 127.0.0.1:1: no answer in 1 s\n"
