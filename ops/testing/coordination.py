"""Throwaway etcd and ZooKeeper servers on loopback ports, from Debian's packages.

Used by the tests and benchmarks of the fleet (etcd leases) and of ``pidctl import-zk``.
They need ``etcd-server`` and ``zookeeper`` installed (``.ci/run`` and ``ops/dev.sh`` do it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ZOOKEEPER = Path("/usr/share/zookeeper/bin/zkServer.sh")


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on {port}")


class EtcdProcess:
    """A single-member etcd; ``kill()`` and ``start()`` again keep its data and ports."""

    def __init__(self, directory: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed (Debian: apt-get install etcd-server)")
        self.binary = binary
        self.directory = directory
        self.client_port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def pid_source(self, prefix: str = "pidctl") -> str:
        return f"{'etcds' if self.tls else 'etcd'}://{self.endpoint}/{prefix}"

    def start(self, timeout: float = 20.0) -> EtcdProcess:
        client = f"{self.scheme}://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary,
            "--name",
            "default",
            "--data-dir",
            str(self.directory / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"default={peer}",
        ]
        if self.tls:
            command += ["--cert-file", str(self.tls[0]), "--key-file", str(self.tls[1])]
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "etcd.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(command, stdout=log, stderr=log)
        log.close()
        _wait_for_port(self.client_port, self.proc, "etcd", timeout)
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        """Until etcd itself answers on its port (not another process that took the port
        while etcd was down: etcd then exits, and this says so)."""
        deadline = time.monotonic() + timeout
        context = None
        if self.tls:
            import ssl

            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode} (port taken?)")
            try:
                url = f"{self.scheme}://{self.endpoint}/health"
                with urllib.request.urlopen(url, timeout=1, context=context) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd on {self.endpoint} did not become healthy")

    def kill(self) -> None:
        """SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def counter(self, prefix: str = "pidctl") -> int | None:
        """The shared counter's value, read over plain HTTP (None when unset)."""
        key = base64.b64encode(f"{prefix}/next_producer_id".encode()).decode()
        request = urllib.request.Request(
            f"http://{self.endpoint}/v3/kv/range", data=json.dumps({"key": key}).encode()
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            kvs = json.load(reply).get("kvs", [])
        return int(base64.b64decode(kvs[0]["value"])) if kvs else None

    def _kv(self, operation: str, body: dict[str, str]) -> None:
        request = urllib.request.Request(
            f"http://{self.endpoint}/v3/kv/{operation}", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            reply.read()

    def set_counter(self, value: int, prefix: str = "pidctl") -> None:
        """Overwrite the shared counter (an operator's mistake, a restored old backup)."""
        key = base64.b64encode(f"{prefix}/next_producer_id".encode()).decode()
        self._kv("put", {"key": key, "value": base64.b64encode(str(value).encode()).decode()})

    def delete_counter(self, prefix: str = "pidctl") -> None:
        """Delete the shared counter's key."""
        key = base64.b64encode(f"{prefix}/next_producer_id".encode()).decode()
        self._kv("deleterange", {"key": key})

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


class ZooKeeperProcess:
    """A standalone ZooKeeper on a loopback port (fsync on, as by default)."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        if not ZOOKEEPER.exists():
            raise RuntimeError("ZooKeeper is not installed (Debian: apt-get install zookeeper)")
        self.port = port or free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ZooKeeperProcess:
        directory = self.directory
        (directory / "data").mkdir(parents=True, exist_ok=True)
        (directory / "zoo.cfg").write_text(
            f"tickTime=2000\ndataDir={directory / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
        )
        env = {**os.environ, "ZOOCFGDIR": str(directory), "ZOO_LOG_DIR": str(directory)}
        self.proc = subprocess.Popen(
            [str(ZOOKEEPER), "start-foreground", str(directory / "zoo.cfg")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, self.proc, "ZooKeeper", timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ZooKeeperProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
