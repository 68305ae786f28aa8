"""Run the real ``pidctl serve`` as a child process on a loopback port, as a user would.

Used by the end-to-end tests and the benchmarks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: Put first on the ``PYTHONPATH`` of every Python process the tests and benchmarks start:
#: a stand-in that keeps hypothesis out of them (its docstring says why).
WITHOUT_HYPOTHESIS = Path(__file__).resolve().parent / "without_hypothesis"


def without_hypothesis(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`WITHOUT_HYPOTHESIS` first on its ``PYTHONPATH`` (once)."""
    path = env.get("PYTHONPATH", "")
    if str(WITHOUT_HYPOTHESIS) in path.split(os.pathsep):
        return dict(env)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(WITHOUT_HYPOTHESIS), path]))}


#: How long a test waits for a condition by default: generous, since CI machines are busy;
#: a condition that holds returns at once.
WAIT_TIMEOUT_S = 60.0

#: A server's settings for snapshots as often as its ``--snapshot-interval-records`` says,
#: however fast the records come (for tests that need many snapshots, not the default's
#: one in ``snapshot_min_interval_ms``).
FREQUENT_SNAPSHOTS = ("--snapshot-min-interval-ms", "0")
#: A server's settings for no snapshot while it runs: more records between two than any run
#: writes (for a measure a snapshot would move).
NO_SNAPSHOTS = ("--snapshot-interval-records", str(10**12))


def wait_until(
    condition: Callable[[], bool], what: str, timeout: float = WAIT_TIMEOUT_S, poll: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; raise TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(poll)


def kill_group_when(
    process: subprocess.Popen[str], condition: Callable[[], bool], what: str, timeout: float
) -> None:
    """SIGKILL ``process``'s whole process group (started with ``start_new_session``) as soon
    as ``condition`` holds; fail, with its stderr, if it ended by itself first."""
    try:
        wait_until(lambda: condition() or process.poll() is not None, what, timeout)
        assert process.poll() is None, process.communicate()[1][-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):  # it had stopped by itself
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)


async def wait_until_async(
    condition: Callable[[], bool], what: str, timeout: float = WAIT_TIMEOUT_S, poll: float = 0.05
) -> None:
    """:func:`wait_until` for trio tests (``condition`` runs on the event loop)."""
    import trio

    with trio.move_on_after(timeout) as scope:
        while not condition():
            await trio.sleep(poll)
    if scope.cancelled_caught:
        raise TimeoutError(f"{what}: not within {timeout} s")


def connect_without_waiting(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A connection to ``port`` begun and not waited for (non-blocking): for floods of
    connections that the server's backlog and accept loop must take."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex((host, port))
    return sock


def strace_prefix(syscall: str, error: str, when: str, path: Path | None = None) -> list[str]:
    """A command prefix running the server under ``strace``, failing the ``when``-th
    ``syscall`` (only those on ``path``, if given) with ``error``: a real failed system call."""
    return strace_inject_prefix(syscall, f"error={error}", when, path)


def strace_delay_prefix(syscall: str, seconds: float, when: str, path: Path) -> list[str]:
    """A command prefix running the server under ``strace``, delaying the ``when``-th
    ``syscall`` on ``path`` (counted per thread) by ``seconds`` after it returns: a slow
    disk, for real."""
    return strace_inject_prefix(syscall, f"delay_exit={round(seconds * 1_000_000)}", when, path)


def strace_inject_prefix(
    syscall: str, action: str, when: str | None, path: Path | Sequence[Path] | None
) -> list[str]:
    """A command prefix running the server under ``strace`` with ``inject=SYSCALL:ACTION``
    (``error=EIO``, ``retval=0``, ``delay_exit=MICROSECONDS``) on the ``when``-th call
    (strace's ``when=`` syntax, counted per thread; None: every call), only on ``path`` (or
    on any of several paths) if given. ``syscall`` may name several, comma-separated."""
    paths = [path] if isinstance(path, Path) else list(path or [])
    only = [arg for each in paths for arg in ("-P", str(each))]
    step = f":when={when}" if when is not None else ""
    return [
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        *only,
        "-e",
        f"trace={syscall}",
        "-e",
        f"inject={syscall}:{action}{step}",
    ]


def add_sasl_user(credentials_file: Path, user: str, password: str) -> None:
    """``pidctl users add`` into ``credentials_file``, as an operator does."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "users",
            "add",
            "--credentials-file",
            str(credentials_file),
            "--user",
            user,
            "--password-stdin",
        ],
        input=password + "\n",
        text=True,
        check=True,
        capture_output=True,
    )


def format_data_dir(data_dir: Path, *settings: str, env: dict[str, str] | None = None) -> None:
    """``pidctl format`` of ``data_dir`` with these setting flags (``--cluster-id``, a
    ``--config``...) and environment, as an operator runs it before the first ``serve`` (in
    this process: a new interpreter per server would cost a second each)."""
    from pidctl.controller.cli import main

    environ = {**os.environ, **(env or {})}
    with contextlib.redirect_stdout(io.StringIO()) as said:
        # --parents: a test's data dir may sit in folders of its own not made yet.
        status = main(["format", *settings, "--parents", "--data-dir", str(data_dir)], environ)
    assert status == 0, f"pidctl format {data_dir}: exit {status}; {said.getvalue()}"


def stored_cluster_id(data_dir: Path) -> str:
    """The cluster id stored in a data dir (read-only; safe while a server runs)."""
    from pidctl.controller.log import formatting

    return str(formatting.stored_cluster_id(data_dir))


def _discard(stream: IO[str]) -> None:
    """Read ``stream`` to its end in large reads (a pipe's whole buffer at a time), keeping
    nothing: the writer never blocks on a full pipe."""
    descriptor = stream.fileno()
    while os.read(descriptor, 1 << 20):
        pass


class ServerProcess:
    """``pidctl serve`` in a subprocess; its JSON log lines are collected in ``events``."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        format: bool = True,
        events_after_start: bool = True,
    ) -> None:
        """``prefix`` runs the server under another command (``strace --inject`` for the
        fault tests); the whole process group is then killed together. A data dir without
        a metadata log is formatted first (with the same settings), as an operator does,
        unless ``format`` is false. ``events_after_start=False``: once the server listens,
        its log is still read (the server writes it as ever) but not parsed or kept, for
        a benchmark's measured server: parsing a JSON line per grant took this process a
        tenth of a core and more, on the cores the server and the load generator share."""
        self.data_dir = data_dir
        self.extra = list(extra)
        self.prefix = list(prefix or [])
        self.format = format
        self.events_after_start = events_after_start
        self.env = without_hypothesis({**os.environ, **(env or {})})
        self.events: list[dict[str, Any]] = []
        self.stderr_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.ports: list[int] = []
        self.metrics_port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def command(self) -> list[str]:
        """Loopback ports picked by the kernel, unless the extra arguments say otherwise."""
        defaults = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        return [
            *self.prefix,
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "serve",
            *defaults,
            "--data-dir",
            str(self.data_dir),
            *self.extra,
        ]

    def start(self, timeout: float = WAIT_TIMEOUT_S) -> ServerProcess:
        from pidctl.controller.log.formatting import is_formatted

        if self.format and not is_formatted(self.data_dir):
            format_data_dir(self.data_dir, *self.extra, env=self.env)
        self.events.clear()
        self.stderr_lines.clear()
        self.proc = subprocess.Popen(
            self.command(),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=bool(self.prefix),
        )
        listening = threading.Event()
        threading.Thread(target=self._drain, args=(self.proc, listening), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not listening.wait(0.05):
            if self.proc.poll() is not None:
                time.sleep(0.1)
                raise RuntimeError(
                    f"pidctl serve exited with {self.proc.returncode}: "
                    + "\n".join(self.stderr_lines[-5:])
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError("pidctl serve did not start listening")
        return self

    def _drain(self, proc: subprocess.Popen[str], listening: threading.Event) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.append(event)
            if event.get("event") == "metrics listening":
                self.metrics_port = event["port"]
            if event.get("event") == "listening":
                self.ports = event["ports"]
                self.port = self.ports[0]
                listening.set()
                if not self.events_after_start:
                    _discard(proc.stderr)
                    return

    def cluster_id(self) -> str:
        """The cluster id stored in the server's data dir."""
        return stored_cluster_id(self.data_dir)

    def event(self, name: str) -> dict[str, Any]:
        return next(e for e in self.events if e.get("event") == name)

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            if self.prefix:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful case. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
