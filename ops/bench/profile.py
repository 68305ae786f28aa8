"""Where a scenario's server time goes: py-spy on the server process while a row's load runs.

    python -m ops.bench.profile ROW [--seconds 5] [--storm 10000] [--gil] [--native] [--idle]
                                    [--ceiling] [--top 25] [--out ops/bench/results]
                                    [--build interpreted|compiled]

ROW is one of the suite's throughput rows (idempotent-16x1, idempotent-16x8,
allocate-durable-16x1, transactional-16x1) or storm. py-spy (the ``bench`` extra) samples
the real ``pidctl serve`` (``--threads``: every thread's samples are kept apart) while the
load generator, in its own process, runs the scenario at its row's point; the raw stacks go
to ``<out>/profile-<row>.txt`` (for a flame graph: ``flamegraph.pl`` or speedscope), and the
summary printed is the functions by their own samples ("self") and by the samples they are
on the stack for ("total"), each as a share of all samples, per thread. ``--idle`` keeps the
samples of threads waiting in a system call (the event loop's epoll wait shows how idle the
server was). ``--ceiling`` profiles the row's baseline instead (ops/bench/ceiling.py under the
same load), to read pidctl's profile against.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ops.bench.common import (
    ROOT,
    add_build_argument,
    ceiling_process,
    exit_on_sigterm,
    run_json,
    use_build,
)
from ops.bench.suite import STORM_LIMITS
from ops.testing.serverproc import ServerProcess, wait_until

#: The load generator's arguments of each row (at the row's own point).
SCENARIOS: dict[str, tuple[str, ...]] = {
    "idempotent-16x1": ("--scenario", "idempotent", "--connections", "16", "--in-flight", "1"),
    "idempotent-16x8": ("--scenario", "idempotent", "--connections", "16", "--in-flight", "8"),
    "allocate-durable-16x1": ("--scenario", "allocate", "--connections", "16"),
    "transactional-16x1": ("--scenario", "transactional", "--connections", "16"),
    "storm": (),
}


@contextmanager
def _server(row: str, ceiling: bool) -> Iterator[tuple[str, int]]:
    """The server under test: its bootstrap address and process id."""
    if ceiling:
        with ceiling_process() as served:
            yield served
        return
    limits = STORM_LIMITS if row == "storm" else ()
    with (
        tempfile.TemporaryDirectory(dir=ROOT) as tmp,
        ServerProcess(Path(tmp) / "d", *limits) as server,
    ):
        assert server.proc is not None
        yield server.bootstrap, server.proc.pid


_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def summarise(raw: str, top: int) -> str:
    """py-spy's raw (collapsed) stacks as the ``top`` functions by self and total share, per
    thread (the first frame, with ``--threads``)."""
    per_thread: dict[str, tuple[collections.Counter[str], collections.Counter[str], int]] = {}
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread ", "process ")) else "all"
        frames = [f for f in frames if not f.startswith(("thread ", "process "))]
        names = [_name(f) for f in frames]
        own, total, samples = per_thread.get(
            thread, (collections.Counter(), collections.Counter(), 0)
        )
        if names:
            own[names[-1]] += count
            for name in set(names):
                total[name] += count
        per_thread[thread] = (own, total, samples + count)
    everything = sum(samples for _, _, samples in per_thread.values()) or 1
    lines = []
    for thread, (own, total, samples) in sorted(per_thread.items(), key=lambda t: -t[1][2]):
        lines.append(f"{thread}: {samples} samples ({samples / everything:.0%} of all)")
        lines.append(f"  {'self':>6} {'total':>6}  function")
        for name, count in own.most_common(top):
            lines.append(f"  {count / samples:>6.1%} {total[name] / samples:>6.1%}  {name}")
    return "\n".join(lines)


def _name(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match['function']} ({match['file']})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("row", choices=SCENARIOS)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--storm", type=int, default=10_000, metavar="PRODUCERS")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    parser.add_argument("--native", action="store_true", help="C frames too")
    parser.add_argument("--idle", action="store_true", help="keep idle threads' samples")
    parser.add_argument("--ceiling", action="store_true", help="profile the baseline instead")
    parser.add_argument("--top", type=int, default=25)
    add_build_argument(
        parser,
        default="interpreted",
        help="interpreted (default: py-spy reads Python's frames, not a compiled module's)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "ops" / "bench" / "results")
    args = parser.parse_args(argv)
    use_build(args.build)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        parser.error("py-spy is not installed (pip install 'pidctl[bench]')")
    args.out.mkdir(parents=True, exist_ok=True)
    raw_path = args.out / f"profile-{args.row}{'-ceiling' * args.ceiling}.txt"
    flags = ["--threads", "--rate", str(args.rate), "--format", "raw", "--nolineno"]
    flags += ["--gil"] * args.gil + ["--native"] * args.native + ["--idle"] * args.idle
    load = list(SCENARIOS[args.row])
    if args.ceiling:
        load += ["--no-unique-check"] + ["--no-register"] * args.row.startswith("allocate")
        if args.row.startswith("transactional"):
            load[1] = "idempotent"  # the row's baseline: the ceiling's InitProducerId
    if args.row == "storm":
        load += ["--storm", str(args.storm)]
    else:
        load += ["--seconds", str(args.seconds)]
    with _server(args.row, args.ceiling) as (bootstrap, pid):
        recorder = subprocess.Popen(
            [spy, "record", "--pid", str(pid), "-o", str(raw_path), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            result = run_json("ops.bench.cloadgen", bootstrap, *load)
        finally:
            recorder.send_signal(signal.SIGINT)
            _, errors = recorder.communicate(timeout=120)
        wait_until(raw_path.exists, f"py-spy's output {raw_path}", timeout=30)
    shown = {k: v for k, v in result.items() if not isinstance(v, list)}
    print(f"{args.row}: {shown}")
    if recorder.returncode not in (0, -signal.SIGINT):
        print(f"py-spy: {errors.strip()}", file=sys.stderr)
    print(summarise(raw_path.read_text(), args.top))


if __name__ == "__main__":
    exit_on_sigterm()
    main()
