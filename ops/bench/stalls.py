"""A probe for the time the machine did not run anything of ours: a process that sleeps a
millisecond at a time and records every wake-up late by more than 2 ms.

On a virtual machine the host may stop all of the guest's CPUs at once: a host that caps
the guest's CPU time per 100 ms period (a CFS quota) stops it for the rest of a period
once the cap is reached. On the development machine (a Firecracker VM, 2 vCPUs) that
happens when both vCPUs are busy and the disk is in use, most likely because the host's
own work for each ``fdatasync`` counts against the cap (seen from inside: the stops come
at one phase of every 100 ms, a CFS quota's period). A process spinning on one vCPU beside a loop of
``write`` + ``fdatasync`` on the other is stopped for 10-20 ms in every 100 ms; neither
alone is stopped at all. Every request in flight during such a stop waits for it, so the
benchmark rows report the probe's count beside their latencies, for pidctl and for the
baseline of the same run.

    python -m ops.bench.stalls     # prints "probing", probes until its standard input
                                   # closes, then prints one JSON object
    python -m ops.bench.stalls --host-check 3 [--dir D]
        # the probe beside a spinning process, beside a write + fdatasync loop (in D), and
        # beside both: does this machine stop its guest when the disk is used?

A late wake-up is also what a busy machine's scheduler gives a sleeper now and then (the
probe is one more process on the same CPUs); the baseline's count shows that part.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from ops.bench.common import ROOT

#: How long the probe sleeps between two looks at the clock.
PERIOD_S = 0.001
#: A wake-up later than this is a stall.
STALL_S = 0.002
#: The probe's first line: it is probing.
READY = "probing\n"


@dataclass
class Stalls:
    """What the probe saw: ``count`` late wake-ups, ``stalled_s`` of lateness in all, the
    longest, over ``seconds`` of probing."""

    count: int = 0
    stalled_s: float = 0.0
    longest_s: float = 0.0
    seconds: float = 0.0

    def add(self, late_s: float) -> None:
        """One wake-up, ``late_s`` seconds after it was due."""
        if late_s > STALL_S:
            self.count += 1
            self.stalled_s += late_s
            self.longest_s = max(self.longest_s, late_s)

    def summary(self) -> dict[str, float]:
        """Per second of probing: how many stalls, how many milliseconds stalled; the
        longest stall in milliseconds."""
        seconds = self.seconds or 1.0
        return {
            "stalls_per_s": self.count / seconds,
            "stalled_ms_per_s": self.stalled_s * 1000 / seconds,
            "longest_stall_ms": self.longest_s * 1000,
        }


def probe(stop: int, started: Callable[[], None]) -> Stalls:
    """Sleep ``PERIOD_S`` at a time until the descriptor ``stop`` is readable (or at its
    end); the late wake-ups. ``started`` is called once the clock runs."""
    stalls = Stalls()
    begun = due = time.perf_counter()
    started()
    while True:
        due += PERIOD_S
        stopping = select.select([stop], [], [], max(0.0, due - time.perf_counter()))[0]
        now = time.perf_counter()
        stalls.add(now - due)  # also when told to stop: the stall may have just ended
        if stopping:
            break
        due = max(due, now)  # one stall is counted once, not once per period it spans
    stalls.seconds = time.perf_counter() - begun
    return stalls


def start_probe() -> subprocess.Popen[str]:
    """The probe in its own process, once it is probing; :func:`finish_probe` stops it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.bench.stalls"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    if proc.stdout.readline() != READY:
        proc.kill()
        proc.wait()
        raise RuntimeError("the stall probe did not start")
    return proc


def finish_probe(proc: subprocess.Popen[str]) -> Stalls:
    """Stop a probe from :func:`start_probe` (its standard input closes) and read what it
    saw."""
    out, _ = proc.communicate(timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"the stall probe exited with {proc.returncode}")
    return Stalls(**json.loads(out))


@contextmanager
def stall_probe() -> Iterator[Stalls]:
    """The probe in its own process while the block runs; the yielded :class:`Stalls` is
    filled in when the block ends."""
    proc = start_probe()
    result = Stalls()
    try:
        yield result
    finally:
        seen = finish_probe(proc)
    for key, value in asdict(seen).items():
        setattr(result, key, value)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _sync_loop(seconds: float, directory: str) -> None:
    """Grant-sized appends, each made durable, as the log's commits are."""
    fd = os.open(os.path.join(directory, "sync-loop"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        os.write(fd, b"x" * 600)
        os.fdatasync(fd)
    os.close(fd)


def host_check(seconds: float, directory: str) -> dict[str, dict[str, float]]:
    """The probe's summary beside a spinning process, beside a ``write`` + ``fdatasync``
    loop, and beside both at once, ``seconds`` each."""
    loads: dict[str, list[Callable[[], None]]] = {
        "spin": [lambda: _spin(seconds)],
        "fdatasync": [lambda: _sync_loop(seconds, directory)],
        "spin+fdatasync": [lambda: _spin(seconds), lambda: _sync_loop(seconds, directory)],
    }
    results = {}
    context = multiprocessing.get_context("fork")
    for name, targets in loads.items():
        with stall_probe() as stalls:
            workers = [context.Process(target=target) for target in targets]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        results[name] = stalls.summary()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host-check", type=float, metavar="SECONDS")
    parser.add_argument("--dir", default=".", help="where --host-check syncs (default: here)")
    args = parser.parse_args()
    if args.host_check:
        with tempfile.TemporaryDirectory(dir=args.dir) as directory:
            json.dump(host_check(args.host_check, directory), sys.stdout, indent=1)
        print()
        return
    stalls = probe(sys.stdin.fileno(), lambda: print(READY, end="", flush=True))
    json.dump(asdict(stalls), sys.stdout)


if __name__ == "__main__":
    main()
