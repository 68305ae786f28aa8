"""The user's own server beside the test suite: the suite must never touch it.

A developer runs ``ops/dev.sh serve`` (on the embedded defaults, 127.0.0.1:9093 and :9464,
data in ``./pidctl-data``) and ``ops/dev.sh test`` beside it. :class:`UserServerCheck` shows
for every run that the suite left that server alone:

- If a default port is taken (most likely the developer's own ``ops/dev.sh serve``), it
  starts nothing and talks to nothing there; it compares the bytes of the checkout's
  ``./pidctl-data`` (the dir that server uses) before and after, if there is one, and says
  which of the two it did.
- If both default ports are free, there is no such server; the check binds nothing there on
  its own (the default ports are the user's, and on a shared machine another run's). With
  ``TEST_USER_SERVER=start`` (a machine of its own, such as CI's) it plays the user instead:
  it starts ``ops/dev.sh serve`` as the README says, in a directory of its own, registers a
  broker and takes a block (a data dir with history, through the real command line), then
  records the data dir's bytes and the server's accepted-connection count. At the end the
  server must still be the same process, have accepted no connection, and its data dir must
  be byte-for-byte what it was. That server dies with the run, also when the run is killed
  (the parent-death signal; only its small directory is then left behind).

Whether a port is taken is read from the kernel's socket tables: nothing is bound there to
find out. When nothing can be checked, the verdict says so rather than pass. Only the test
session's controlling process runs it (not each xdist worker).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ops.testing.serverproc import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: The embedded defaults of ``pidctl serve`` (DESIGN.md §2): only the server this check plays
#: (``play_user``) binds them.
DEFAULT_LISTEN = ("127.0.0.1", 9093)
DEFAULT_METRICS = ("127.0.0.1", 9464)
ACCEPTED = "pidctl_connections_accepted_total"


#: The kernel's tables of TCP sockets; state 0A is LISTEN.
_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"


def _address(hex_address: str) -> str:
    """An address as /proc/net/tcp{,6} write it (32-bit words in the host's byte order),
    IPv4 also when a Java-style IPv6 socket listens on it (``::ffff:127.0.0.1``)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[at : at + 4][::-1] for at in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def listening() -> set[tuple[str, int]]:
    """Every (address, port) a TCP socket of this machine listens on, read from the
    kernel's tables: nothing is bound or connected to find out."""
    found = set()
    for table in _TCP_TABLES:
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN:
                host, port = fields[1].split(":")
                found.add((_address(host), int(port, 16)))
    return found


def port_free(address: tuple[str, int]) -> bool:
    """Whether a server could listen on ``address`` now: nothing listens on it or on its
    port's wildcard address (without binding it to find out: the default ports are the
    user's, and the check must not take them even for a moment)."""
    host, port = address
    return not any(
        (host, port) == (their_host, their_port) or their_host in ("0.0.0.0", "::")
        for their_host, their_port in listening()
        if their_port == port
    )


def digest(data_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under ``data_dir``, by relative path."""
    return {
        str(path.relative_to(data_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(data_dir.rglob("*"))
        if path.is_file()
    }


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


@dataclass
class UserServerCheck:
    """See the module's description. ``start()`` before the tests, ``finish()`` after;
    ``verdict`` then says what was checked, and ``failed`` whether the suite touched it.
    ``play_user``: start the user's server when the default ports are free. ``listen``,
    ``metrics`` and ``checkout`` are the defaults' and this checkout's except in the check's
    own tests."""

    play_user: bool = False
    listen: tuple[str, int] = DEFAULT_LISTEN
    metrics: tuple[str, int] = DEFAULT_METRICS
    checkout: Path = ROOT
    directory: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    watched: Path | None = None
    before: dict[str, str] = field(default_factory=dict)
    accepted: float = 0.0
    verdict: str = ""
    failed: bool = False

    @property
    def data_dir(self) -> Path:
        assert self.directory is not None
        return self.directory / "pidctl-data"

    @property
    def _ports(self) -> str:
        return "{}:{} or :{}".format(*self.listen, self.metrics[1])

    def start(self) -> None:
        user_data = self.checkout / "pidctl-data"
        if port_free(self.listen) and port_free(self.metrics):
            if self.play_user:
                self._start_server()
            else:
                self.verdict = (
                    f"NOT CHECKED: nothing listens on {self._ports} (no server of the user's"
                    " to leave alone; TEST_USER_SERVER=start plays one on a machine of its own)"
                )
        elif user_data.is_dir():
            self.watched = user_data
            self.before = digest(self.watched)
        else:
            self.verdict = (
                f"NOT CHECKED: {self._ports} is taken by a process this run did not start,"
                f" and there is no {user_data} to watch instead"
            )

    def _start_server(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pidctl-user-"))
        env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
        ports = []  # the README's command has none: the defaults
        if (self.listen, self.metrics) != (DEFAULT_LISTEN, DEFAULT_METRICS):
            ports = ["--listen", "{}:{}".format(*self.listen)]
            ports += ["--metrics-listen", "{}:{}".format(*self.metrics)]
        self.proc = subprocess.Popen(
            # A run killed before finish() must not leave a server on the user's ports.
            ["setpriv", "--pdeathsig", "TERM", str(ROOT / "ops" / "dev.sh"), "serve", *ports],
            cwd=self.directory,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = "http://{}:{}".format(*self.metrics)
        try:
            wait_until(lambda: self._ready(url), "the user's server ready", timeout=120)
            bootstrap = "{}:{}".format(*self.listen)
            cli = [sys.executable, "-m", "pidctl.controller.cli"]
            register = [*cli, "register", "--bootstrap", bootstrap, "--broker-id", "1"]
            said = subprocess.run(register, check=True, capture_output=True, text=True)
            epoch = said.stdout.split()[-1]
            allocate = [*cli, "allocate", "--bootstrap", bootstrap, "--broker-id", "1"]
            subprocess.run([*allocate, "--broker-epoch", epoch], check=True, capture_output=True)
            self.accepted = _metric(url, ACCEPTED)
            self.watched = self.data_dir
            self.before = digest(self.watched)
        except BaseException:
            self._stop()
            raise

    def _ready(self, url: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the user's server exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def finish(self) -> None:
        if self.watched is None:
            return
        try:
            if self.proc is not None:
                self._finish_server()
            else:
                after = digest(self.watched)
                changed = sorted(set(self.before.items()) ^ set(after.items()))
                where = f"{self.watched} ({self._ports} was taken: not started)"
                self._judge(where, [name for name, _ in changed])
        finally:
            self._stop()

    def _finish_server(self) -> None:
        assert self.proc is not None
        url = "http://{}:{}".format(*self.metrics)
        if self.proc.poll() is not None:
            self.failed = True
            status = self.proc.returncode
            self.verdict = f"FAILED: the user's server stopped during the run (exit {status})"
            return
        accepted = _metric(url, ACCEPTED) - self.accepted
        after = digest(self.watched) if self.watched else {}
        changed = sorted({name for name, _ in set(self.before.items()) ^ set(after.items())})
        problems = [f"{accepted:g} connection(s) accepted"] if accepted else []
        self._judge(
            f"a real `ops/dev.sh serve` on {self._ports}, data in {self.data_dir}",
            changed,
            problems,
        )

    def _judge(self, where: str, changed: list[str], problems: list[str] | None = None) -> None:
        problems = list(problems or [])
        if changed:
            problems.append(f"data dir changed: {', '.join(changed)}")
        self.failed = bool(problems)
        if self.failed:
            self.verdict = f"FAILED: the suite touched {where}: {'; '.join(problems)}"
        else:
            files = len(self.before)
            self.verdict = f"untouched: {where}, {files} file(s) byte-for-byte as before"

    def _stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self.proc = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
