"""The fault campaign: SIGKILLs, injected I/O errors, damaged newest records and a fleet's
counter going back, at random points under mixed load.

    python -m ops.bench.faults [--kills 1000] [--faults 100] [--flips 100] [--regressions 20]
                               [--episode 20] [--seed 1] [--build compiled|interpreted]

Each episode is one data dir that lives through ``--episode`` cycles. A cycle starts the real
``pidctl serve`` on it (a failed start counts as a failed restart), loads it with brokers
allocating blocks, idempotent and transactional producers, and named jobs of three SASL
principals (each its own app ids, each re-running its versions and asking for another's:
``ops/testing/grants.py``), and then either SIGKILLs it after a random moment, or has
``strace --inject`` fail a random write, fdatasync, fsync or rename of the data dir with EIO
or ENOSPC, or SIGKILLs it and then flips one bit at a random byte of the newest record on
disk (bit rot of a synced, acknowledged record, which start-up cannot tell from a torn
write). After each cycle the data dir is checked against everything acknowledged in the
episode so far: an acknowledged grant missing from the log is lost (except the ones in the
record the campaign itself destroyed, which are counted apart); a PID acknowledged twice was
handed out twice; a named job's block must be recorded for its principal, its re-run
answered the same blocks or refused, another principal refused (each miss a problem). A
fault not reached in time (the call was not made again) is tried again, so that ``--faults``
faults are really injected.

Then ``--regressions`` fleet cycles: two controllers leasing from one real etcd
(``pid_source``), both loaded, the shared counter deleted or set back below the leases
taken at a random moment, the load going on; the counter put back (as an operator does
after the alert), both SIGKILLed and restarted. Every PID either controller acknowledged is
checked against the other's: none twice.

The servers run pidctl compiled, as the image ships it (``ops/compiled.py``; ``--build
interpreted``: the checkout as it is). Prints one JSON object; exits 1 unless lost, twice
and failed restarts are all 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from ops.bench.common import add_build_argument, first_overlap, use_build
from ops.testing.coordination import EtcdProcess
from ops.testing.grants import Acknowledged, GrantLoad, JobBlock, check_data_dir
from ops.testing.serverproc import (
    FREQUENT_SNAPSHOTS,
    ServerProcess,
    add_sasl_user,
    strace_prefix,
    wait_until,
)
from pidctl.controller.core.logformat import SEGMENT_SUFFIX
from pidctl.controller.core.records import (
    JobBlockRecorded,
    ProducerIdsGranted,
    TransactionalIdUpdated,
)
from pidctl.controller.log.recovery import read_log

#: Injected faults: the system call, the errors it gets, and whether to aim at the active
#: segment (fdatasync is also used for other files). Records are written with pwrite64, the
#: preallocated zeros with pwritev2 (os.pwritev; a full disk there only stops
#: preallocation, so it is not chosen).
FAULTS = [
    ("fdatasync", ("EIO",), True),
    ("pwrite64", ("EIO", "ENOSPC"), True),
    ("pwritev2", ("EIO",), True),
    ("fsync", ("EIO", "ENOSPC"), False),  # rolls, snapshots and reservations
    ("rename", ("EIO",), False),  # rolls, snapshots and reservations
]
#: Small segments, frequent snapshots and small reservations (4 blocks: a reservation file
#: written every fourth grant), so that rolls, snapshots and reservations are often under
#: way when a kill or a fault comes.
SETTINGS = (
    "--segment-max-bytes",
    "20000",
    "--snapshot-interval-records",
    "300",
    *FREQUENT_SNAPSHOTS,
    "--producer-id-reservation",
    "4000",
    "--log-retention-bytes",
    "100000000",
    # A named job's re-run is answered for 3 s of job time (and refused for 3 s of running
    # time after a damaged tail); nothing expires within a campaign.
    "--job-allocation-reuse-ms",
    "3000",
    "--job-allocation-expiration-ms",
    "3600000",
)
#: The principals whose named jobs run in the kill, fault and flip cycles (SCRAM users on
#: a SASL_PLAINTEXT listener beside the plain one the other load uses).
PRINCIPALS = (("team-a", "team-a-pw"), ("team-b", "team-b-pw"), ("team-c", "team-c-pw"))
LISTENERS = ("--listeners", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0")
#: How long a faulty server may run before the fault is given up on (it was not reached).
FAULT_TIMEOUT_S = 8.0


#: A fleet cycle's lease size: small, so that both controllers lease again soon after the
#: counter went back.
FLEET_LEASE = "20000"


@dataclass
class Tally:
    kills: int = 0
    faults_injected: int = 0
    faults_not_reached: int = 0
    bits_flipped: int = 0
    flips_not_reached: int = 0
    #: Acknowledged answers whose record the campaign destroyed itself (a flipped bit): not
    #: in the log by design, and checked only for being handed out twice.
    destroyed_by_flips: int = 0
    counter_regressions: int = 0
    regressions_refused: int = 0
    grants_acknowledged: int = 0
    #: Named jobs' blocks acknowledged (each version's block once, however often re-run).
    job_blocks_acknowledged: int = 0
    #: What the named jobs' threads saw that must never happen.
    job_problems: int = 0
    #: Their refusals that may happen (a version's age unknown or past the window, no PID
    #: ready yet), by error name.
    job_refusals: dict[str, int] = field(default_factory=dict)
    grants_checked: int = 0
    handed_out_twice: int = 0
    acknowledged_lost: int = 0
    restarts_failed: int = 0
    problems: list[str] = field(default_factory=list)


def _active_segment(data_dir: Path) -> Path | None:
    segments = sorted(data_dir.glob("*" + SEGMENT_SUFFIX))
    return segments[-1] if segments else None


def _newest_record(segment: Path) -> tuple[int, int] | None:
    """Where the last whole record of a segment starts and ends (each record's u32 length
    says where the next one begins; a partial one a SIGKILL left after it is not it), or
    None if the segment holds none."""
    data = segment.read_bytes()
    found, position = None, 0
    while position + 8 <= len(data):
        end = position + 8 + int.from_bytes(data[position : position + 4], "big")
        if end > len(data):
            break
        found, position = (position, end), end
    return found


def _flip_newest_record(
    data_dir: Path, acked: Acknowledged, destroyed: Acknowledged, rng: random.Random
) -> bool:
    """Flip one bit at a random byte of the newest record on disk; what it acknowledged moves
    from ``acked`` to ``destroyed``. False if there is no record to flip."""
    segment = _active_segment(data_dir)
    entries = read_log(data_dir).entries()
    if segment is None or not entries:
        return False
    newest = _newest_record(segment)
    if newest is None:
        return False
    record = entries[-1].record  # the newest whole record, the one flipped
    start, end = newest
    data = bytearray(segment.read_bytes())
    position = rng.randrange(start, end)
    data[position] ^= 1 << rng.randrange(8)
    segment.write_bytes(bytes(data))
    with acked.lock:
        if isinstance(record, ProducerIdsGranted) and record.holder == "broker":
            block = (record.first_producer_id, record.next_producer_id - record.first_producer_id)
            if block in acked.blocks:
                acked.blocks.remove(block)
                destroyed.blocks.append(block)
        elif isinstance(record, ProducerIdsGranted):  # the controller's InitProducerId pool
            inside = [
                p for p in acked.pids if record.first_producer_id <= p < record.next_producer_id
            ]
            for pid in inside:
                acked.pids.remove(pid)
            destroyed.pids.extend(inside)
        elif isinstance(record, TransactionalIdUpdated):
            answer = (record.transactional_id, record.producer_id, record.producer_epoch)
            if answer in acked.transactional:
                acked.transactional.remove(answer)
                destroyed.transactional.append(answer)
        elif isinstance(record, JobBlockRecorded):
            job = JobBlock(
                record.principal or "",
                record.app_id,
                record.version,
                record.block,
                record.first_producer_id,
            )
            while job in acked.jobs:  # (answered again by the re-run)
                acked.jobs.remove(job)
                destroyed.jobs.append(job)
    return True


def _cycle(
    data_dir: Path,
    acked: Acknowledged,
    destroyed: Acknowledged,
    tally: Tally,
    rng: random.Random,
    kind: str,
    credentials: Path,
) -> None:
    fault = kind == "fault"
    prefix: list[str] = []
    if fault:
        syscall, errors, on_segment = rng.choice(FAULTS)
        segment = _active_segment(data_dir) if on_segment else None
        prefix = strace_prefix(syscall, rng.choice(errors), str(rng.randint(1, 12)), segment)
    server = ServerProcess(
        data_dir, *SETTINGS, *LISTENERS, "--credentials-file", str(credentials), prefix=prefix
    )
    try:
        server.start(timeout=30)
    except (RuntimeError, TimeoutError) as e:
        if fault:  # the fault hit start-up itself: a failed start is the right answer
            tally.faults_injected += 1
            return
        tally.restarts_failed += 1
        tally.problems.append(f"restart failed: {e}")
        return
    before, jobs_before = acked.count, _job_blocks(acked)
    load = GrantLoad(
        server.bootstrap,
        server.cluster_id(),
        acked,
        brokers=(1,),
        transactional_ids=("tx-a",),
        principals=PRINCIPALS,
        sasl_bootstrap=f"127.0.0.1:{server.ports[1]}",
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
            if kind == "flip":  # a record of this run's own to flip, on a busy machine too
                with contextlib.suppress(TimeoutError):  # else the flip finds none: tried again
                    wait_until(lambda: acked.count > before, "a grant", FAULT_TIMEOUT_S, 0.02)
            time.sleep(rng.uniform(0.02, 0.3))
            tally.kills += 1
    finally:
        server.kill()
        load.stop()
    tally.grants_acknowledged += acked.count - before
    tally.job_blocks_acknowledged += _job_blocks(acked) - jobs_before
    if kind == "flip":
        gone = destroyed.count
        if _flip_newest_record(data_dir, acked, destroyed, rng):
            tally.bits_flipped += 1
            tally.destroyed_by_flips += destroyed.count - gone
        else:  # the kill came just after a roll: the active segment holds no whole record
            tally.flips_not_reached += 1


def _job_blocks(acked: Acknowledged) -> int:
    """Named jobs' blocks acknowledged, each once however often it was re-run."""
    return len({(job.app_id, job.version, job.block) for job in acked.jobs})


def _check(data_dir: Path, acked: Acknowledged, destroyed: Acknowledged, tally: Tally) -> None:
    """What the log holds against what was acknowledged; a flipped record's answers are not
    looked for in it, but still count for handing out twice. (A damaged tail is truncated
    by the next start, which the check before it does not see: it reads the log as a
    restart would, but changes nothing.)"""
    verdict = check_data_dir(data_dir, acked)
    everything = Acknowledged(
        acked.blocks + destroyed.blocks,
        acked.pids + destroyed.pids,
        acked.transactional + destroyed.transactional,
        jobs=acked.jobs + destroyed.jobs,
    )
    twice = check_data_dir(data_dir, everything).handed_out_twice
    tally.grants_checked += verdict.checked
    tally.acknowledged_lost += len(verdict.lost)
    tally.handed_out_twice += len(twice)
    with acked.lock:  # what the named jobs' threads saw that must not happen
        seen, acked.problems = acked.problems, []
        for error, times in acked.job_refusals.items():
            name = ErrorCode(error).name.upper()
            tally.job_refusals[name] = tally.job_refusals.get(name, 0) + times
        acked.job_refusals.clear()
    tally.job_problems += len(seen)
    tally.problems += verdict.lost[:3] + twice[:3] + seen[:3]


def run(kills: int, faults: int, flips: int, episode: int, seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    plan = ["kill"] * kills + ["fault"] * faults + ["flip"] * flips
    rng.shuffle(plan)
    # A fault not reached in time, or a flip that found no record, is tried again (at most
    # as often as each was asked for).
    retries = {"fault": faults, "flip": flips}
    with tempfile.TemporaryDirectory() as tmp:
        credentials = Path(tmp) / "users.json"
        for user, password in PRINCIPALS:
            add_sasl_user(credentials, user, password)
        start = 0
        while start < len(plan):  # the plan may grow while it runs
            data_dir = Path(tmp) / f"episode-{start // episode}"
            acked, destroyed = Acknowledged(), Acknowledged()
            for kind in plan[start : start + episode]:
                not_reached = tally.faults_not_reached + tally.flips_not_reached
                _cycle(data_dir, acked, destroyed, tally, rng, kind, credentials)
                _check(data_dir, acked, destroyed, tally)
                missed = tally.faults_not_reached + tally.flips_not_reached > not_reached
                if missed and retries.get(kind):
                    retries[kind] -= 1
                    plan.append(kind)
            # The last restart of the episode, and its check.
            try:
                ServerProcess(data_dir, *SETTINGS).start(timeout=30).kill()
            except (RuntimeError, TimeoutError) as e:
                tally.restarts_failed += 1
                tally.problems.append(f"restart failed: {e}")
            _check(data_dir, acked, destroyed, tally)
            shutil.rmtree(data_dir, ignore_errors=True)
            start += episode
            print(f"{min(start, len(plan))}/{len(plan)} cycles", file=sys.stderr)


def _fleet_cycle(tmp: Path, index: int, tally: Tally, rng: random.Random) -> None:
    """Two controllers on one etcd; the counter deleted or set back under load, then put
    back; both SIGKILLed and restarted. Their acknowledged PIDs must never meet."""
    with EtcdProcess(tmp / f"etcd-{index}") as etcd:
        controllers = [
            ServerProcess(
                tmp / f"fleet-{index}-{node}",
                "--node-id",
                str(node),
                "--cluster-id",
                "faultsFaultsFaults0001",
                "--pid-source",
                etcd.pid_source(),
                "--pid-lease-size",
                FLEET_LEASE,
                *SETTINGS,
            )
            for node in (1, 2)
        ]
        acked = [Acknowledged(), Acknowledged()]
        loads: list[GrantLoad] = []
        try:
            for node, server in enumerate(controllers):
                server.start(timeout=30)
                load = GrantLoad(server.bootstrap, server.cluster_id(), acked[node])
                loads.append(load.start())
            try:
                time.sleep(rng.uniform(0.2, 1.0))
                counter = etcd.counter() or 0
                if rng.random() < 0.5:
                    etcd.delete_counter()
                else:
                    etcd.set_counter(rng.randrange(0, max(1, counter)))
                tally.counter_regressions += 1
                time.sleep(rng.uniform(1.0, 3.0))  # the load goes on past the leases held
                refused = sum(
                    any(e.get("event") == "etcd counter went back" for e in server.events)
                    for server in controllers
                )
                etcd.set_counter(counter)  # the operator puts it back
                time.sleep(rng.uniform(0.2, 1.0))
            finally:
                for server in controllers:
                    server.kill()
                for load in loads:
                    load.stop()
            tally.regressions_refused += refused > 0
            for server in controllers:
                server.start(timeout=30)
        except (RuntimeError, TimeoutError) as e:
            tally.restarts_failed += 1
            tally.problems.append(f"fleet restart failed: {e}")
        finally:
            for server in controllers:
                server.kill()
        for server, answers in zip(controllers, acked, strict=True):
            tally.grants_acknowledged += answers.count
            _check(server.data_dir, answers, Acknowledged(), tally)
        blocks = [(f, n) for answers in acked for f, n in answers.blocks]
        blocks += [(p, 1) for answers in acked for p in answers.pids]
        # A transactional id keeps its PID across epochs: each PID once per controller.
        for answers in acked:
            blocks += [(pid, 1) for pid in {pid for _, pid, _ in answers.transactional}]
        overlap = first_overlap(blocks)
        if overlap is not None:
            tally.handed_out_twice += 1
            tally.problems.append(f"fleet: PIDs at {overlap} handed out by both controllers")


def run_fleet(regressions: int, seed: int, tally: Tally) -> None:
    rng = random.Random(seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(regressions):
            _fleet_cycle(Path(tmp), index, tally, rng)
            print(f"{index + 1}/{regressions} fleet cycles", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--flips", type=int, default=100, help="bit flips of the newest record")
    parser.add_argument(
        "--regressions", type=int, default=20, help="fleet cycles with the etcd counter going back"
    )
    parser.add_argument("--episode", type=int, default=20, help="cycles per data dir")
    parser.add_argument("--seed", type=int, default=1)
    add_build_argument(parser)
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("faults: strace is needed (apt-get install strace)", file=sys.stderr)
        return 2
    if args.regressions and shutil.which("etcd") is None:
        print("faults: etcd is needed (apt-get install etcd-server)", file=sys.stderr)
        return 2
    build = use_build(args.build)
    started = time.monotonic()
    tally = Tally()
    run(args.kills, args.faults, args.flips, args.episode, args.seed, tally)
    run_fleet(args.regressions, args.seed, tally)
    result: dict[str, Any] = {
        "build": build,
        "seconds": round(time.monotonic() - started, 1),
        **{k: v for k, v in vars(tally).items() if k != "problems"},
        "problems": tally.problems[:20],
    }
    print(json.dumps(result))
    clean = (
        tally.acknowledged_lost
        == tally.handed_out_twice
        == tally.restarts_failed
        == tally.job_problems
        == 0
    )
    return 0 if clean and not tally.problems else 1


if __name__ == "__main__":
    sys.exit(main())
