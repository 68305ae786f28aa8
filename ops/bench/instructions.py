"""Instructions per request at saturation: each throughput row's server and its baseline under
valgrind's callgrind, loaded by the compiled load generator.

    python -m ops.bench.instructions [ROW ...] [--seconds 4] [--repeat 1] [--keep DIR]
                                     [--build compiled|interpreted]

ROW is one of the suite's throughput rows (idempotent-16x1, idempotent-16x8,
allocate-durable-16x1, transactional-16x1; all four by default). For each, the framing
ceiling answering the row's baseline API and then ``pidctl serve`` run under callgrind
(instrumented only once started and warmed up); the load generator, a native process far
faster than either server under valgrind, keeps the row's connections x in-flight requests
waiting on the server all the time. Two windows are measured, of S and 3 S seconds of load,
with the counters zeroed before each and dumped once the server has settled after it (its
connections closed); the figure is the difference of their instructions over the
difference of their requests, so what a window pays once (its connections' set-up, a
broker's registration, their close) drops out. What the server does on a timer (its
watchdog, metrics, expiry) is measured apart, holding the row's connections idle, and taken
off each window for its length: under valgrind a server answers 50-100 times fewer requests
a second, and timers would otherwise weigh as much more. CPython's cyclic garbage
collector is taken off too and shown per window (``gc_instructions``): its collections come
in lumps (a full one of pidctl's heap is 28 M instructions) with a window's connections and
its length, not with its requests (the same counts in windows of 219 and 632 requests), and
one in one window and none in the other would move the figure by a fifth. Snapshots are
pushed past the run (``snapshot_interval_records``) for the same reason: the rows that
write records moved by up to a tenth with where one fell.

What it counts is the server's own user-space instructions (every thread), which a busy
machine does not change: the figure to compare two versions of the code on a machine whose
speed moves from minute to minute. What it does not count: the kernel's work for the
server's system calls (reads, writes, epoll, ``fdatasync``), and time spent waiting (a
durable commit's sync); the suite's ``server_cpu_us_per_request`` includes the former and
its rates the latter. ``ratio`` is the ceiling's instructions per request over pidctl's
(garbage collection left out of both): the throughput ratio the row would have if both
were limited by user-space instructions alone. The servers' data go to the system's
temporary directory (``TMPDIR``) and are removed; ``--keep DIR`` keeps each window's dump
(``callgrind.out.1``, ``.2``) for ``callgrind_annotate``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ops.bench import cloadgen
from ops.bench.common import add_build_argument, ceiling_process, exit_on_sigterm, use_build
from ops.testing.serverproc import NO_SNAPSHOTS, ServerProcess
from pidctl.protocol import requests

#: Each row: (pidctl's scenario, the ceiling's, connections, requests in flight each).
ROWS: dict[str, tuple[str, str, int, int]] = {
    "idempotent-16x1": ("idempotent", "idempotent", 16, 1),
    "idempotent-16x8": ("idempotent", "idempotent", 16, 8),
    "allocate-durable-16x1": ("allocate", "allocate", 16, 1),
    "transactional-16x1": ("transactional", "idempotent", 16, 1),
}

#: A server under callgrind starts 20-50 times slower than without.
START_TIMEOUT_S = 600.0
#: How long one window's load may take in all (its connections' set-up included).
LOAD_DEADLINE_S = 1200.0


def valgrind_prefix(out: Path) -> list[str]:
    """Run a command under callgrind, instrumenting nothing until told to (``-i on``)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    return [
        valgrind,
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        "--quiet",
    ]


def control(pid: int, *args: str) -> str:
    """``callgrind_control`` on the server (instrumentation on or off, zero, read, dump)."""
    done = subprocess.run(
        ["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)}: {done.stderr or done.stdout}")
    return done.stdout


#: A thread's line in ``callgrind_control -e Ir``: "Th 1  11,192,093".
_THREAD_TOTAL = re.compile(r"^\s*Th\s+\d+\s+([\d,]+)\s*$", re.MULTILINE)


def instructions(pid: int) -> int:
    """The instructions counted since the counters were last zeroed, every thread's."""
    return counted(control(pid, "-e", "Ir"))


def counted(shown: str) -> int:
    """The sum of the threads' totals in ``callgrind_control -e Ir``'s output."""
    counts = _THREAD_TOTAL.findall(shown)
    if not counts and "Totals:" not in shown:
        raise RuntimeError(f"callgrind_control -e Ir said no totals: {shown!r}")
    # (No thread's line under "Totals:" when no thread has run an instruction since.)
    return sum(int(count.replace(",", "")) for count in counts)


#: A server counting fewer instructions a second than this, twice in a row, has settled
#: (under valgrind a loaded one counts tens of millions; an idle one a few hundred thousand).
SETTLED_PER_SECOND = 1_000_000


def settle(pid: int, timeout: float = 120.0) -> None:
    """Until the server is quiet: a window's connections closed and their tasks ended (the
    server sees a close after the load generator has gone)."""
    deadline = time.monotonic() + timeout
    last, quiet = instructions(pid), 0
    while quiet < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not settle within {timeout} s")
        time.sleep(1.0)
        counted = instructions(pid)
        quiet = quiet + 1 if counted - last < SETTLED_PER_SECOND else 0
        last = counted


#: CPython's cyclic garbage collector, counted apart (see the module's text).
GC_FUNCTION = "gc_collect_main"
#: A function's line in ``callgrind_annotate --inclusive=yes``: "28,195,890 (12.84%)  file:fn".
_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\([\d. %]+\)\s+\*?\s*(\S+)", re.MULTILINE)


class Window(NamedTuple):
    """One load window's counts: instructions (all, and the garbage collector's), requests
    answered, seconds from the counters' zeroing to the server's settling."""

    instructions: int
    gc_instructions: int
    requests: int
    seconds: float


def window(pid: int, out: Path, load: Callable[[], dict[str, Any]]) -> Window:
    """One load window, from the counters zeroed before it until the server has settled
    after it (its connections closed), its profile dumped beside ``out``."""
    control(pid, "--zero")
    started = time.monotonic()
    result = load()
    settle(pid)
    seconds = time.monotonic() - started
    total, gc = profile_totals(dump(pid, out))
    return Window(total, gc, int(result["requests"]), seconds)


def dump(pid: int, out: Path, timeout: float = 120.0) -> Path:
    """Dump the counts since the last zeroing (callgrind then zeroes them) into the next of
    ``out``'s numbered files; that file."""
    before = set(out.parent.glob(f"{out.name}.*"))
    control(pid, "--dump")
    deadline = time.monotonic() + timeout
    while True:
        new = set(out.parent.glob(f"{out.name}.*")) - before
        if new and all(path.stat().st_size > 0 for path in new):
            [path] = new
            return path
        if time.monotonic() > deadline:
            raise RuntimeError(f"callgrind wrote no dump beside {out} within {timeout} s")
        time.sleep(0.1)


def profile_totals(path: Path) -> tuple[int, int]:
    """A dump's instructions: all of them, and those of the garbage collector (inclusive)."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return annotated_totals(done.stdout)


def annotated_totals(annotated: str) -> tuple[int, int]:
    """(all instructions, the garbage collector's) in ``callgrind_annotate``'s output."""
    total, gc = None, 0
    for count, where in _ANNOTATED.findall(annotated):
        if where == "PROGRAM":
            total = int(count.replace(",", ""))
        elif where.rpartition(":")[2] == GC_FUNCTION:  # ("'2" marks a recursive call)
            gc += int(count.replace(",", ""))
    if total is None:
        raise RuntimeError(f"callgrind_annotate gave no program totals: {annotated[:500]!r}")
    return total, gc


def idle_per_second(pid: int, bootstrap: str, conns: int, seconds: float) -> float:
    """Instructions a second of a server holding ``conns`` idle connections (each served
    one ApiVersions first, so that it has been accepted): what the server does on a timer
    (a watchdog, expiry, metrics), which a slow server under valgrind does as often as a
    fast one, over 50-100 times fewer requests."""
    host, _, port = bootstrap.rpartition(":")
    request = cloadgen.frame_of(requests.api_versions()).data
    sockets = [socket.create_connection((host, int(port)), timeout=600) for _ in range(conns)]
    try:
        for sock in sockets:
            sock.sendall(request)
            _receive_frame(sock)
        settle(pid)
        control(pid, "--zero")
        started = time.monotonic()
        time.sleep(seconds)
        counted = instructions(pid)
        return counted / (time.monotonic() - started)
    finally:
        for sock in sockets:
            sock.close()


def _receive_frame(sock: socket.socket) -> bytes:
    """One size-prefixed answer."""
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed an idle connection")
        data += chunk
    return data


def per_request(
    pid: int,
    out: Path,
    bootstrap: str,
    make_load: Callable[[], cloadgen.Load],
    seconds: float,
    conns: int,
    k: int,
) -> dict[str, Any]:
    """Instructions per request from a short and a long window, less what the server does
    on a timer meanwhile and its garbage collections (see the module's text)."""

    def load(seconds: float) -> dict[str, Any]:
        return cloadgen.run(
            bootstrap,
            make_load(),
            connections=conns,
            in_flight=k,
            seconds=seconds,
            deadline=LOAD_DEADLINE_S,
        )

    load(seconds)  # warm-up
    control(pid, "--instr=on")
    settle(pid)
    short = window(pid, out, lambda: load(seconds))
    long = window(pid, out, lambda: load(3 * seconds))
    idle = idle_per_second(pid, bootstrap, conns, 2 * seconds)
    if long.requests <= short.requests:
        raise RuntimeError(f"the long window answered no more requests ({short}, {long})")

    def work(w: Window) -> float:
        return w.instructions - w.gc_instructions - idle * w.seconds

    return {
        "instructions_per_request": (work(long) - work(short)) / (long.requests - short.requests),
        "idle_instructions_per_second": idle,
        "requests": [short.requests, long.requests],
        "instructions": [short.instructions, long.instructions],
        "gc_instructions": [short.gc_instructions, long.gc_instructions],
        "window_s": [round(short.seconds, 2), round(long.seconds, 2)],
    }


@contextmanager
def _pidctl(directory: Path, out: Path) -> Iterator[tuple[str, int]]:
    # No snapshot within the windows (the module's docstring says why).
    server = ServerProcess(directory / "d", *NO_SNAPSHOTS, prefix=valgrind_prefix(out))
    server.start(timeout=START_TIMEOUT_S)
    try:
        assert server.proc is not None
        yield server.bootstrap, server.proc.pid
    finally:
        server.kill()


def measure_row(row: str, seconds: float, directory: Path) -> dict[str, Any]:
    """The row's ceiling and pidctl, one after the other, each under callgrind."""
    scenario, ceiling_scenario, conns, k = ROWS[row]
    figures: dict[str, Any] = {"row": row}
    out = directory / "ceiling" / "callgrind.out"
    out.parent.mkdir(parents=True)
    with ceiling_process(valgrind_prefix(out)) as (bootstrap, pid):

        def ceiling_load() -> cloadgen.Load:
            return cloadgen.scenario_load(bootstrap, ceiling_scenario, register=False).unchecked()

        figures["ceiling"] = per_request(pid, out, bootstrap, ceiling_load, seconds, conns, k)
    out = directory / "pidctl" / "callgrind.out"
    out.parent.mkdir(parents=True)
    with _pidctl(directory / "pidctl", out) as (bootstrap, pid):
        brokers = iter(range(10_000, 10**9, 10_000))

        def pidctl_load() -> cloadgen.Load:
            return cloadgen.scenario_load(bootstrap, scenario, broker_base=next(brokers))

        figures["pidctl"] = per_request(pid, out, bootstrap, pidctl_load, seconds, conns, k)
    figures["ratio"] = (
        figures["ceiling"]["instructions_per_request"]
        / figures["pidctl"]["instructions_per_request"]
    )
    return figures


def _millions(counts: list[int]) -> str:
    return " / ".join(f"{count / 1e6:.1f} M" for count in counts)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rows", nargs="*", metavar="ROW", help=f"rows: {', '.join(ROWS)}")
    parser.add_argument("--seconds", type=float, default=4.0, help="the short window")
    parser.add_argument("--repeat", type=int, default=1, help="measure each row this often")
    parser.add_argument("--keep", type=Path, help="keep callgrind's dumps here")
    add_build_argument(parser)
    args = parser.parse_args(argv)
    print(f"pidctl: {use_build(args.build)}", flush=True)
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown:
        parser.error(f"unknown row {', '.join(unknown)}; rows: {', '.join(ROWS)}")
    results = []
    for row in args.rows or list(ROWS):
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="pidctl-instructions-") as tmp:
                started = time.monotonic()
                figures = measure_row(row, args.seconds, Path(tmp))
                if args.keep is not None:
                    target = args.keep / f"{row}-{int(time.time())}"
                    shutil.copytree(tmp, target, ignore=shutil.ignore_patterns("d"))
            figures["took_s"] = round(time.monotonic() - started, 1)
            results.append(figures)
            ceiling, mine = figures["ceiling"], figures["pidctl"]
            print(
                f"{row:<24} pidctl {mine['instructions_per_request']:>9,.0f}  ceiling "
                f"{ceiling['instructions_per_request']:>9,.0f} instructions per request  "
                f"ratio {figures['ratio']:.2f}  (garbage collection per window: pidctl "
                f"{_millions(mine['gc_instructions'])}, ceiling "
                f"{_millions(ceiling['gc_instructions'])})  {json.dumps(figures)}",
                flush=True,
            )
    return results


if __name__ == "__main__":
    exit_on_sigterm()
    main()
