"""The fault campaign: SIGKILLs and injected I/O errors at random points under mixed load.

    python -m ops.bench.faults [--kills 1000] [--faults 100] [--episode 20] [--seed 1]

Each episode is one data dir that lives through ``--episode`` cycles. A cycle starts the real
``pidctl serve`` on it (a failed start counts as a failed restart), loads it with brokers
allocating blocks and idempotent and transactional producers (``ops/testing/grants.py``),
and then either SIGKILLs it after a random moment, or has ``strace --inject`` fail a random
write, fdatasync, fsync or rename of the data dir with EIO or ENOSPC. After each cycle the
data dir is checked against everything acknowledged in the episode so far: an acknowledged
grant missing from the log is lost; a PID acknowledged twice was handed out twice. A fault
not reached in time (the call was not made again) is tried again, so that ``--faults`` faults
are really injected. Prints
one JSON object; exits 1 unless lost, twice and failed restarts are all 0.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.testing.grants import Acknowledged, GrantLoad, check_data_dir
from ops.testing.serverproc import ServerProcess, strace_prefix
from pidctl.controller.log.metalog import SEGMENT_SUFFIX

#: Injected faults: the system call, the errors it gets, and whether to aim at the active
#: segment (write and fdatasync are also used for stderr and other files).
FAULTS = [
    ("fdatasync", ("EIO",), True),
    ("write", ("EIO", "ENOSPC"), True),
    ("fsync", ("EIO", "ENOSPC"), False),  # rolls and snapshots
    ("rename", ("EIO",), False),  # rolls and snapshots
]
#: Small segments and frequent snapshots, so that rolls and snapshots are often under way.
SETTINGS = (
    "--segment-max-bytes",
    "20000",
    "--snapshot-interval-records",
    "300",
    "--log-retention-bytes",
    "100000000",
)
#: How long a faulty server may run before the fault is given up on (it was not reached).
FAULT_TIMEOUT_S = 8.0


@dataclass
class Tally:
    kills: int = 0
    faults_injected: int = 0
    faults_not_reached: int = 0
    grants_acknowledged: int = 0
    grants_checked: int = 0
    handed_out_twice: int = 0
    acknowledged_lost: int = 0
    restarts_failed: int = 0
    problems: list[str] = field(default_factory=list)


def _active_segment(data_dir: Path) -> Path | None:
    segments = sorted(data_dir.glob("*" + SEGMENT_SUFFIX))
    return segments[-1] if segments else None


def _cycle(
    data_dir: Path, acked: Acknowledged, tally: Tally, rng: random.Random, fault: bool
) -> None:
    prefix: list[str] = []
    if fault:
        syscall, errors, on_segment = rng.choice(FAULTS)
        segment = _active_segment(data_dir) if on_segment else None
        prefix = strace_prefix(syscall, rng.choice(errors), str(rng.randint(1, 12)), segment)
    server = ServerProcess(data_dir, *SETTINGS, prefix=prefix)
    try:
        server.start(timeout=30)
    except (RuntimeError, TimeoutError) as e:
        if fault:  # the fault hit start-up itself: a failed start is the right answer
            tally.faults_injected += 1
            return
        tally.restarts_failed += 1
        tally.problems.append(f"restart failed: {e}")
        return
    before = acked.count
    load = GrantLoad(
        server.bootstrap, server.cluster_id(), acked, brokers=(1,), transactional_ids=("tx-a",)
    ).start()
    try:
        assert server.proc is not None
        if fault:
            deadline = time.monotonic() + FAULT_TIMEOUT_S
            while server.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if server.proc.poll() is None:
                tally.faults_not_reached += 1
            elif any(e.get("event") == "storage_failed" for e in server.events):
                tally.faults_injected += 1
            else:
                tally.problems.append(f"exited {server.proc.returncode} without storage_failed")
        else:
            time.sleep(rng.uniform(0.02, 0.3))
            tally.kills += 1
    finally:
        server.kill()
        load.stop()
    tally.grants_acknowledged += acked.count - before


def _check(data_dir: Path, acked: Acknowledged, tally: Tally) -> None:
    verdict = check_data_dir(data_dir, acked)
    tally.grants_checked += verdict.checked
    tally.acknowledged_lost += len(verdict.lost)
    tally.handed_out_twice += len(verdict.handed_out_twice)
    tally.problems += verdict.lost[:3] + verdict.handed_out_twice[:3]


def run(kills: int, faults: int, episode: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    plan = [False] * kills + [True] * faults
    rng.shuffle(plan)
    retries = faults  # a fault not reached in time is tried again, at most this often
    with tempfile.TemporaryDirectory() as tmp:
        start = 0
        while start < len(plan):  # the plan may grow while it runs
            data_dir = Path(tmp) / f"episode-{start // episode}"
            acked = Acknowledged()
            for fault in plan[start : start + episode]:
                not_reached = tally.faults_not_reached
                _cycle(data_dir, acked, tally, rng, fault)
                _check(data_dir, acked, tally)
                if tally.faults_not_reached > not_reached and retries:
                    retries -= 1
                    plan.append(True)
            # The last restart of the episode, and its check.
            try:
                ServerProcess(data_dir, *SETTINGS).start(timeout=30).kill()
            except (RuntimeError, TimeoutError) as e:
                tally.restarts_failed += 1
                tally.problems.append(f"restart failed: {e}")
            shutil.rmtree(data_dir, ignore_errors=True)
            start += episode
            print(f"{min(start, len(plan))}/{len(plan)} cycles", file=sys.stderr)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--episode", type=int, default=20, help="cycles per data dir")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("faults: strace is needed (apt-get install strace)", file=sys.stderr)
        return 2
    started = time.monotonic()
    tally = run(args.kills, args.faults, args.episode, args.seed)
    result: dict[str, Any] = {
        "seconds": round(time.monotonic() - started, 1),
        **{k: v for k, v in vars(tally).items() if k != "problems"},
        "problems": tally.problems[:20],
    }
    print(json.dumps(result))
    clean = tally.acknowledged_lost == tally.handed_out_twice == tally.restarts_failed == 0
    return 0 if clean and not tally.problems else 1


if __name__ == "__main__":
    sys.exit(main())
