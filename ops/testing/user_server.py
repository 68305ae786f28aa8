"""The user's own server beside the test suite: the suite must never touch it.

A developer runs ``ops/dev.sh serve`` (on the embedded defaults, 127.0.0.1:9093 and :9464,
data in ``./pidctl-data``) and ``ops/dev.sh test`` beside it. :class:`UserServerCheck` shows
for every run that the suite left that server alone:

- If both default ports are free, it plays the user: it starts ``ops/dev.sh serve`` as the
  README says, in a directory of its own, registers a broker and takes a block (a data dir
  with history, through the real command line), then records the data dir's bytes and the
  server's accepted-connection count. At the end the server must still be the same process,
  have accepted no connection, and its data dir must be byte-for-byte what it was.
- If a default port is taken (most likely the developer's own ``ops/dev.sh serve``), it
  starts nothing and talks to nothing there; it compares the bytes of the checkout's
  ``./pidctl-data`` (the dir that server uses) before and after instead, if there is one,
  and says which of the two it did. When neither can run, it says so rather than pass.

Only the test session's controlling process runs it (not each xdist worker).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ops.testing.serverproc import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: The embedded defaults of ``pidctl serve`` (DESIGN.md §2), which only this check binds.
DEFAULT_LISTEN = ("127.0.0.1", 9093)
DEFAULT_METRICS = ("127.0.0.1", 9464)
ACCEPTED = "pidctl_connections_accepted_total"


def port_free(address: tuple[str, int]) -> bool:
    """Whether ``address`` can be bound now (nothing listens there)."""
    with socket.socket() as probe:
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


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
    ``verdict`` then says what was checked, and ``failed`` whether the suite touched it."""

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

    def start(self) -> None:
        if port_free(DEFAULT_LISTEN) and port_free(DEFAULT_METRICS):
            self._start_server()
        elif (ROOT / "pidctl-data").is_dir():
            self.watched = ROOT / "pidctl-data"
            self.before = digest(self.watched)
        else:
            self.verdict = (
                "NOT CHECKED: 127.0.0.1:9093 or :9464 is taken by a process this run did not "
                f"start, and there is no {ROOT / 'pidctl-data'} to watch instead"
            )

    def _start_server(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pidctl-user-"))
        env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
        self.proc = subprocess.Popen(
            [str(ROOT / "ops" / "dev.sh"), "serve"],
            cwd=self.directory,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = "http://{}:{}".format(*DEFAULT_METRICS)
        try:
            wait_until(lambda: self._ready(url), "the user's server ready", timeout=120)
            bootstrap = "{}:{}".format(*DEFAULT_LISTEN)
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
                where = f"{self.watched} (127.0.0.1:9093 or :9464 was taken: not started)"
                self._judge(where, [name for name, _ in changed])
        finally:
            self._stop()

    def _finish_server(self) -> None:
        assert self.proc is not None
        url = "http://{}:{}".format(*DEFAULT_METRICS)
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
            f"a real `ops/dev.sh serve` on 127.0.0.1:9093/9464, data in {self.data_dir}",
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
