"""A throwaway PostgreSQL server (Debian's postgresql package) on a loopback port.

For the exactly-once sink's tests and benchmark. PostgreSQL refuses to run as root, so as
root the cluster belongs to the ``postgres`` user the Debian package creates.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from ops.testing.coordination import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return found[-1]


class PostgresProcess:
    """``initdb`` into a fresh directory, ``pg_ctl start``; ``url`` connects as postgres."""

    def __init__(self) -> None:
        self.port = free_port()
        # Not under pytest's tmp_path: the postgres user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="pidctl-pg-"))
        self.as_root = os.geteuid() == 0
        self._databases = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh, empty database of this server (one per test keeps tests apart); its URL."""
        import psycopg

        self._databases += 1
        name = f"test_{self._databases}"
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + "/" + name

    def _run(self, *command: str) -> None:
        if self.as_root:
            command = ("runuser", "-u", "postgres", "--", *command)
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> PostgresProcess:
        data = self.directory / "data"
        if self.as_root:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self._run(_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self.directory / "server.log"),
            "-w",
            "start",
        )
        return self

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self._run(_bin("pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PostgresProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
