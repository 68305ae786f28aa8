"""What the benchmarks share: running a piece in its own process, reading memory, and the
framing-ceiling server."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ops import compiled
from ops.testing.serverproc import without_hypothesis

ROOT = Path(__file__).resolve().parents[2]


def run_json(module: str, *args: str) -> dict[str, Any]:
    """``python -m module args`` in its own process (no GIL shared with the caller or the
    server); its standard output is one JSON object."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=without_hypothesis(os.environ),
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def first_overlap(blocks: Iterable[tuple[int, int]]) -> tuple[int, int] | None:
    """The starts of the first two (start, length) blocks that overlap, or None: what every
    benchmark and crash test checks of the blocks it was granted."""
    for (a, a_length), (b, _) in itertools.pairwise(sorted(blocks)):
        if a + a_length > b:
            return a, b
    return None


#: ``--build``: which pidctl the processes a benchmark starts run.
BUILDS = ("compiled", "interpreted")


def add_build_argument(
    parser: argparse.ArgumentParser,
    default: str = "compiled",
    help: str = "pidctl as the image ships it (default), or the checkout interpreted",
) -> None:
    """The ``--build`` option of a benchmark's command line (its value: :func:`use_build`)."""
    parser.add_argument("--build", choices=BUILDS, default=default, help=help)


T = TypeVar("T")


def median_by(rounds: Sequence[T], key: Callable[[T], float]) -> T:
    """The round whose ``key`` (a ratio) is the median of them all, the upper of the middle
    two for an even count: the round a row reports."""
    return sorted(rounds, key=key)[len(rounds) // 2]


def use_build(build: str) -> str:
    """Make every process this benchmark starts (the servers, and the ceiling, which shares
    pidctl's framing) run pidctl's ``compiled`` build, as the image ships it
    (:mod:`ops.compiled`, built now if this checkout has not been), or the ``interpreted``
    checkout as it is; returns what the results record. The benchmark's own process is
    not changed: it only drives and reads."""
    if build == "interpreted":
        return build
    tree = str(compiled.tree())
    path = os.environ.get("PYTHONPATH", "")
    if tree not in path.split(os.pathsep):  # (ops/dev.sh test has put it there already)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, path]))
    return f"compiled ({Path(tree).name})"


def exit_on_sigterm() -> None:
    """Make SIGTERM (a timeout's, a closing session's) end the benchmark as Ctrl-C does: by
    an exception, so that its ``with`` blocks stop the servers it started and remove its
    temporary directories instead of leaving them behind."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def rss_kib(pid: int | str = "self", field: str = "VmRSS") -> int:
    """Resident set size of a process, in KiB (``field="VmHWM"``: the most it has had)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


@contextmanager
def ceiling_server() -> Iterator[str]:
    """ops/bench/ceiling.py on a free loopback port; yields its HOST:PORT."""
    with ceiling_process() as (address, _):
        yield address


@contextmanager
def ceiling_process(prefix: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """:func:`ceiling_server`, yielding its HOST:PORT and its process id (for a profiler);
    ``prefix`` runs it under another command that keeps its process (valgrind)."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "ops.bench.ceiling", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=without_hypothesis(os.environ),  # as pidctl's servers (ServerProcess)
    )
    try:
        assert proc.stdout is not None
        yield f"127.0.0.1:{int(proc.stdout.readline())}", proc.pid
    finally:
        proc.kill()
        proc.wait()
