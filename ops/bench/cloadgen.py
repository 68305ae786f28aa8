"""The compiled load generator (``ops/bench/loadgen.c``), built on first use, driven with
frames that kio encodes.

The C program is one process with one epoll loop that knows nothing of any API: it is given
request frames encoded here once, which bytes to change per connection (a broker id, the
digits of a transactional id, an incarnation id) and per request (the correlation id), and
where an answer's error code, producer id and epoch or block are. So it can load any
Kafka-protocol server: pidctl, the framing ceiling, a Kafka broker (InitProducerId) or a
KRaft controller's listener (BrokerRegistration, then AllocateProducerIds at the epoch the
registration answered). Its own CPU time per request is a fraction of any Python server's,
so the rates it measures are the server's (the Python generator, ``ops/bench/loadgen.py``,
stays for correctness runs).

It is compiled with the machine's C compiler (``cc``, or ``$CC``) into ``ops/bench/.build/``
(git ignores it), under a name made from the source's hash: a changed source is rebuilt.

    python -m ops.bench.cloadgen HOST:PORT [--scenario idempotent|transactional|allocate]
        [--connections 16] [--in-flight 1] [--seconds 3] [--broker-base 10000]
        [--no-register] [--no-unique-check] [--pid PID] [--storm PRODUCERS [--spread 1]]

prints the generator's JSON: the rate, latency percentiles (p50/p90/p99/p99.9/max), its own
CPU time and that of every ``--pid`` over the measured window.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.broker_registration.v4 import BrokerRegistrationRequest

from ops.bench.common import ROOT
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, response_header_version
from pidctl.protocol.codec import encode_request

SOURCE = Path(__file__).with_name("loadgen.c")
#: Where the binary is built (ignored by git; see .gitignore).
BUILD_DIR = ROOT / "ops" / "bench" / ".build"
CFLAGS = ("-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror")

#: Offsets in the answers' bodies (after the response header), the same in every version
#: pidctl and Kafka serve: throttle time (int32) first, then the error code (int16), then
#: InitProducerId's producer id (int64) and epoch (int16), AllocateProducerIds' start
#: (int64) and length (int32), BrokerRegistration's broker epoch (int64). ApiVersions' body
#: begins with its error code. tests/ops/test_bench.py checks them against kio's encoders.
ERROR_AT = {ApiKey.API_VERSIONS: 0}
THROTTLED_ERROR_AT = 4
PRODUCER_ID_AT, PRODUCER_EPOCH_AT = 6, 14
BLOCK_START_AT, BLOCK_LENGTH_AT = 6, 14
BROKER_EPOCH_AT = 6
#: InitProducerId's retriable "no PID ready" (COORDINATOR_LOAD_IN_PROGRESS), retried 50 ms
#: later as clients do (Kafka's retry.backoff.ms is larger, 100 ms): in a storm, and in a load
#: against Kafka's broker, which answers it while it waits for a block of PIDs. A storm's
#: producer whose connection is reset connects again after the same 50 ms.
RETRIABLE = 14
RETRY_MS = 50
#: A client id for the templates (Kafka's clients send one; a quota would key on it).
CLIENT_ID = "pidctl-loadgen"


class LoadFailed(RuntimeError):
    """The load generator found an answer it did not expect (or could not connect)."""


def binary() -> Path:
    """The compiled generator, built now if this source has not been built yet."""
    source = SOURCE.read_bytes()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise LoadFailed("no C compiler (cc or gcc) to build ops/bench/loadgen.c")
    digest = hashlib.sha256(source + " ".join((compiler, *CFLAGS)).encode()).hexdigest()[:16]
    path = BUILD_DIR / f"loadgen-{digest}"
    if path.exists():
        return path
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name, then renamed: two benchmarks starting at once both build,
    # and neither runs a half-written file.
    fd, temporary = tempfile.mkstemp(dir=BUILD_DIR, prefix=".loadgen-")
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *CFLAGS, "-o", temporary, str(SOURCE)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(temporary, path)
    except subprocess.CalledProcessError as e:
        raise LoadFailed(f"building {SOURCE.name} failed:\n{e.stderr}") from e
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


@dataclass(frozen=True)
class Frame:
    """A request frame (with its length prefix) and how to read its answer: the answer's
    header version and where in its body the error code is (None: nowhere)."""

    data: bytes
    response_header: int
    error_at: int | None

    def argument(self) -> str:
        error_at = -1 if self.error_at is None else self.error_at
        return f"{self.response_header}:{error_at}:{self.data.hex()}"


def frame_of(body: Any) -> Frame:
    """``body`` (a kio request entity) encoded as the generator's template."""
    api_key, version = body.__api_key__, body.__version__
    return Frame(
        encode_request(body, 0, CLIENT_ID),
        response_header_version(api_key, version),
        ERROR_AT.get(api_key, THROTTLED_ERROR_AT),
    )


def offset_of(frame: Frame, value: bytes) -> int:
    """Where ``value`` (a sentinel put into a template) is in ``frame``: exactly once."""
    at = frame.data.find(value)
    if at < 0 or frame.data.find(value, at + 1) >= 0:
        raise ValueError(f"{value.hex()} is not in the frame exactly once")
    return at


@dataclass
class Load:
    """What each connection sends: set-up frames (once each, in order), then the request,
    with the patches, captures and checks of ``loadgen.c``'s options."""

    request: Frame
    setup: list[Frame] = field(default_factory=list)
    #: (frame: a set-up index or "r", offset, width, base, "int" or "dec")
    patches: list[tuple[str, int, int, int, str]] = field(default_factory=list)
    #: (set-up frame, body offset, width, frame: a later set-up index or "r", offset)
    captures: list[tuple[int, int, int, str, int]] = field(default_factory=list)
    #: Answer fields that never repeat: (body offset, width), one or two.
    unique_key: tuple[tuple[int, int], ...] = ()
    #: Blocks that never overlap: (start's body offset, length's body offset).
    unique_blocks: tuple[int, int] | None = None
    retry: tuple[int, int] | None = None

    def unchecked(self) -> Load:
        """The same load without the uniqueness checks (for a server of canned answers)."""
        return Load(self.request, self.setup, self.patches, self.captures, retry=self.retry)

    def arguments(self) -> list[str]:
        args = []
        for frame in self.setup:
            args += ["--setup", frame.argument()]
        args += ["--request", self.request.argument()]
        for which, offset, width, base, kind in self.patches:
            args += ["--patch", f"{which}:{offset}:{width}:{base}" + (":dec" * (kind == "dec"))]
        for source, body_offset, width, target, offset in self.captures:
            args += ["--capture", f"{source}:{body_offset}:{width}:{target}:{offset}"]
        if self.unique_key:
            args += ["--unique-key", ",".join(f"{o}:{w}" for o, w in self.unique_key)]
        if self.unique_blocks is not None:
            args += ["--unique-blocks", "{}:{}".format(*self.unique_blocks)]
        if self.retry is not None:
            args += ["--retry", "{}:{}".format(*self.retry)]
        return args


_PID_AND_EPOCH = ((PRODUCER_ID_AT, 8), (PRODUCER_EPOCH_AT, 2))


def idempotent(version: int = 5) -> Load:
    """InitProducerId without a transactional id: a fresh PID per request."""
    return Load(
        frame_of(requests.init_producer_id(None, version=version)),
        unique_key=_PID_AND_EPOCH,
        retry=(RETRIABLE, RETRY_MS),
    )


#: Digits of the connection's number in the transactional ids of :func:`transactional`.
TRANSACTIONAL_ID_DIGITS = 6


def transactional(prefix: str = "bench-", version: int = 5) -> Load:
    """InitProducerId re-initialising the connection's own transactional id (``prefix``
    and the connection's number): a new epoch, durable, on every request."""
    template = "9" * TRANSACTIONAL_ID_DIGITS
    request = frame_of(requests.init_producer_id(prefix + template, version=version))
    at = offset_of(request, (prefix + template).encode()) + len(prefix)
    return Load(
        request,
        patches=[("r", at, TRANSACTIONAL_ID_DIGITS, 0, "dec")],
        unique_key=_PID_AND_EPOCH,
        retry=(RETRIABLE, RETRY_MS),
    )


_BROKER_SENTINEL = 0x5A5A_5A01
_EPOCH_SENTINEL = 0x5A5A_5A5A_5A5A_5A02


def allocate(
    broker_base: int,
    registration: Callable[[int, uuid.UUID], BrokerRegistrationRequest] | None = None,
    epoch: int = 0,
) -> Load:
    """AllocateProducerIds from one broker per connection (broker ``broker_base`` + its
    number). With ``registration`` (a BrokerRegistration for a broker id and incarnation),
    each connection registers first and allocates at the epoch its answer gave; without,
    at ``epoch`` (the framing ceiling answers any)."""
    sentinels = frame_of(requests.allocate(_BROKER_SENTINEL, _EPOCH_SENTINEL))
    broker_at = offset_of(sentinels, _BROKER_SENTINEL.to_bytes(4, "big"))
    epoch_at = offset_of(sentinels, _EPOCH_SENTINEL.to_bytes(8, "big"))
    request = frame_of(requests.allocate(_BROKER_SENTINEL, epoch))
    load = Load(
        request,
        patches=[("r", broker_at, 4, broker_base, "int")],
        unique_blocks=(BLOCK_START_AT, BLOCK_LENGTH_AT),
    )
    if registration is not None:
        # A random incarnation per run; the connection's number in its last four bytes.
        incarnation = uuid.UUID(bytes=uuid.uuid4().bytes[:12] + b"\x5a\x5a\x5a\x03")
        setup = frame_of(registration(_BROKER_SENTINEL, incarnation))
        incarnation_at = offset_of(setup, incarnation.bytes)
        load.setup = [setup]
        load.patches += [
            ("0", offset_of(setup, _BROKER_SENTINEL.to_bytes(4, "big")), 4, broker_base, "int"),
            ("0", incarnation_at + 12, 4, int.from_bytes(uuid.uuid4().bytes[:3], "big"), "int"),
        ]
        load.captures = [(0, BROKER_EPOCH_AT, 8, "r", epoch_at)]
    return load


def pidctl_registration(cluster_id: str) -> Callable[[int, uuid.UUID], BrokerRegistrationRequest]:
    """BrokerRegistration v4 as pidctl's own broker library sends it."""
    return lambda broker_id, incarnation: requests.registration(broker_id, cluster_id, incarnation)


def storm_load() -> Load:
    """A producer's start: ApiVersions, then an idempotent InitProducerId (retried on 14)."""
    load = idempotent()
    load.setup = [frame_of(requests.api_versions())]
    load.unique_key = ((PRODUCER_ID_AT, 8),)
    return load


def run(
    bootstrap: str,
    load: Load,
    *,
    connections: int = 16,
    in_flight: int = 1,
    seconds: float = 3.0,
    pids: Sequence[int] = (),
    storm: bool = False,
    spread: float = 1.0,
    deadline: float = 120.0,
) -> dict[str, Any]:
    """Run the generator; its JSON result. Raises :class:`LoadFailed` on any unexpected
    answer, a broken connection or a deadline passed."""
    args = [
        str(binary()),
        bootstrap,
        "--connections",
        str(connections),
        "--in-flight",
        str(in_flight),
        "--seconds",
        str(seconds),
        "--deadline",
        str(deadline),
        *load.arguments(),
    ]
    for pid in pids:
        args += ["--pid", str(pid)]
    if storm:
        args += ["--storm", "--spread", str(spread)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise LoadFailed(done.stderr.strip() or f"load generator exited {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def cluster_id_of(bootstrap: str) -> str:
    """The cluster id a server's Metadata answer names (for registrations)."""
    from pidctl.client import SyncClient

    with SyncClient(bootstrap) as client:
        cluster_id: str = client.request(requests.metadata([])).cluster_id
    return cluster_id


SCENARIOS = ("idempotent", "transactional", "allocate")


def scenario_load(
    bootstrap: str, scenario: str, *, broker_base: int = 10_000, register: bool = True
) -> Load:
    """The load of one of :data:`SCENARIOS` against pidctl (``register``: brokers register
    first, with the cluster id the server names) or against the ceiling."""
    if scenario == "idempotent":
        return idempotent()
    if scenario == "transactional":
        return transactional()
    if scenario == "allocate":
        registration = pidctl_registration(cluster_id_of(bootstrap)) if register else None
        return allocate(broker_base, registration)
    raise ValueError(f"unknown scenario {scenario!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bootstrap")
    parser.add_argument("--scenario", choices=SCENARIOS, default="idempotent")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--broker-base", type=int, default=10_000)
    parser.add_argument("--no-register", action="store_true", help="allocate: no registration")
    parser.add_argument("--no-unique-check", action="store_true", help="for canned answers")
    parser.add_argument("--pid", type=int, action="append", default=[], help="server to cost")
    parser.add_argument("--storm", type=int, metavar="PRODUCERS")
    parser.add_argument("--spread", type=float, default=1.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.storm:
        load = storm_load()
    else:
        load = scenario_load(
            args.bootstrap,
            args.scenario,
            broker_base=args.broker_base,
            register=not args.no_register,
        )
    if args.no_unique_check:
        load = load.unchecked()
    result = run(
        args.bootstrap,
        load,
        connections=args.storm or args.connections,
        in_flight=args.in_flight,
        seconds=args.seconds,
        pids=args.pid,
        storm=bool(args.storm),
        spread=args.spread,
    )
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
