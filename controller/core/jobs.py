"""Job allocations: the producer-id blocks a named job version holds, so that a re-run of the
same version gets the same PIDs back, for the principal that owns the name and no other.

A Spark job that writes to Kafka with preallocated PIDs (``format("pidctl-kafka")``) writes
nothing twice on a re-run only if the re-run produces with the *same* PIDs: the brokers then
recognise what the first run wrote by the PIDs' sequences. So a job may name itself — an app
id and a version, Delta Lake's ``txnAppId``/``txnVersion``, or a streaming query's id and
batch id — and pidctl records which blocks that version got, under that name, in the log.

The name travels in the request header's client id (:func:`parse_job_key`), with Kafka's
AllocateProducerIds v0 body unchanged: BrokerId -1 and BrokerEpoch -1 mark a job as before.
A version's blocks are asked for in order (block 0, 1, ...): a block already recorded is
answered again and nothing is written; the next one is granted from the producer-id manager
and recorded beside the grant. Per app id only the latest version is kept.

An app id is owned, as a resource: the principal that records its first version owns it
(the record names it), and only it is answered the app id's blocks or may record a newer
version; anyone else is refused TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as a principal
without an ACL for it is (``api/allocate_producer_ids.py`` checks the ACL: Write on the ``AppId``
resource). :meth:`JobAllocationManager.refusal` is that check, for any request naming an
app id. An app id no longer than ``max_app_id_bytes``, and at most
``max_app_ids_per_principal`` of them per owner (POLICY_VIOLATION, nothing recorded).

For the owner:

- an older version is refused PRODUCER_FENCED: a later version of the app has run;
- the same version longer than ``reuse_ms`` of job time after its first block (or than the
  key's ``max_age_ms``, the brokers' own ``producer.id.expiration.ms`` read by the job), or
  one whose age is unknown (the clocks, ``job_clock.py``), is refused UNKNOWN_PRODUCER_ID:
  the brokers keep a PID's sequences only ``producer.id.expiration.ms`` after its last
  write, so a re-run past that could no longer tell what the first run wrote;
- after a start-up that cut a damaged tail off the log, a block not in the log is refused
  UNKNOWN_PRODUCER_ID for ``reuse_ms`` of running time: its record may have been lost, and
  answering anew would hand out other blocks than the first run got;
- an app id whose latest version is older than ``expiration_ms`` of running time is
  forgotten (a record says so, :meth:`JobAllocationManager.expire`); a later request with
  it starts afresh, and may be anyone's.

A controller in a fleet (``pid_source``) keeps its job records to itself, so a re-run that
reached another controller would get other blocks: there a named job is refused
INVALID_REQUEST (a job without a name is served as before).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_clock import JobClock
from pidctl.controller.core.job_table import AppVersion, JobTable
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.controller.core.producer_ids import Block, ProducerIdControlManager
from pidctl.controller.core.records import (
    SNAPSHOT_CHUNK_BYTES,
    DamagedTailTruncated,
    JobAllocationExpired,
    JobAllocationsLoaded,
    JobBlockRecorded,
    JobClockAdvanced,
    JobsState,
    Record,
)
from pidctl.controller.core.result import ControllerResult, answer

#: The client id of a keyed job request: ``pidctl-job/<version>/<block>/<app id>``. The app
#: id comes last, so it may hold any character, the slash too.
JOB_KEY_PREFIX: Final = "pidctl-job/"
#: Default of ``job_allocation_reuse_ms``: Kafka's ``producer.id.expiration.ms`` default (one
#: day), how long a broker keeps a silent PID's sequences.
DEFAULT_REUSE_MS: Final = 86_400_000
#: Default of ``job_allocation_expiration_ms``: Kafka's ``transactional.id.expiration.ms``.
DEFAULT_EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000
#: Default of ``job_allocation_expiry_batch``: app ids forgotten in one step.
DEFAULT_EXPIRY_BATCH: Final = 1000
#: Most blocks one job version may hold (a million partitions): bounds what one app id keeps.
MAX_BLOCKS_PER_VERSION: Final = 1000
#: Default of ``max_job_app_id_bytes``: Spark's application and query ids are under 100
#: characters; an app id is kept per version in memory, in snapshots and in every block's
#: record, so a name of 32 KiB (what a client id may carry) is refused.
DEFAULT_MAX_APP_ID_BYTES: Final = 256
#: Default of ``max_job_app_ids_per_principal``: app ids one owner may hold at once (each
#: until it expires). A stream holds one, a daily batch job one per name.
DEFAULT_MAX_APP_IDS_PER_PRINCIPAL: Final = 10_000
#: Most running time between two :class:`JobClockAdvanced` records (written by the expiry's
#: steps while app ids are held), and at most a tenth of ``expiration_ms``: what a restart
#: may not count.
CLOCK_RECORD_INTERVAL_MS: Final = 60_000


@dataclass(frozen=True, slots=True)
class JobKey:
    """Which block of which version of which app a keyed job request asks for; and at most
    how old (job time since its first block) a version may be to be answered again:
    ``max_age_ms``, the brokers' ``producer.id.expiration.ms`` the job read from them
    (``pidctl-job/VERSION/BLOCK~MAX_AGE_MS/APP_ID``), None for ``reuse_ms`` alone."""

    app_id: str
    version: int
    block: int
    max_age_ms: int | None = None

    def client_id(self) -> str:
        """The client id that carries this key on the wire."""
        age = "" if self.max_age_ms is None else f"~{self.max_age_ms}"
        return f"{JOB_KEY_PREFIX}{self.version}/{self.block}{age}/{self.app_id}"


#: What a client id's bytes that are not UTF-8 are read as (U+FFFD, the replacement
#: character): a job key holding it is refused.
UNREADABLE: Final = "\ufffd"


def parse_job_key(client_id: str | None) -> JobKey | None:
    """The key a job's client id carries, None for any other client id; raises ValueError
    for a client id with the prefix that is not a well-formed key."""
    if client_id is None or not client_id.startswith(JOB_KEY_PREFIX):
        return None
    parts = client_id[len(JOB_KEY_PREFIX) :].split("/", 2)
    if len(parts) != 3 or not parts[2]:
        raise ValueError(f"job key {client_id!r} is not {JOB_KEY_PREFIX}VERSION/BLOCK/APP_ID")
    if UNREADABLE in client_id:
        # A client id that was not UTF-8 is read with U+FFFD where its bytes were not
        # (protocol/headers.py, as Kafka reads it): two different app ids could then be read
        # as one, and be handed one app's blocks.
        raise ValueError(f"job key {client_id!r} is not UTF-8 (or holds U+FFFD)")
    version, block, app_id = parts
    block, _, age = block.partition("~")
    numbers = (version, block, age) if age else (version, block)
    if not all(n.isdigit() and n.isascii() for n in numbers):
        raise ValueError(f"job key {client_id!r}: version, block and age must be non-negative")
    if int(version) >= 2**63 or int(block) >= MAX_BLOCKS_PER_VERSION or int(age or 0) >= 2**63:
        raise ValueError(
            f"job key {client_id!r}: version below 2^63, block below {MAX_BLOCKS_PER_VERSION}"
        )
    return JobKey(app_id, int(version), int(block), int(age) if age else None)


_NOT_OWNER: Final = Block(ErrorCode.transactional_id_authorization_failed)
_INVALID: Final = Block(ErrorCode.invalid_request)
_UNKNOWN_AGE: Final = Block(ErrorCode.unknown_producer_id)
_FENCED: Final = Block(ErrorCode.producer_fenced)
_TOO_MANY: Final = Block(ErrorCode.policy_violation)


@dataclass(slots=True)
class JobAllocationManager:
    """The blocks each app id's latest version holds, and who owns it."""

    producer_ids: ProducerIdControlManager = field(compare=False, repr=False)
    reuse_ms: int = field(default=DEFAULT_REUSE_MS, compare=False)
    expiration_ms: int = field(default=DEFAULT_EXPIRATION_MS, compare=False)
    max_app_id_bytes: int = field(default=DEFAULT_MAX_APP_ID_BYTES, compare=False)
    max_app_ids_per_principal: int = field(default=DEFAULT_MAX_APP_IDS_PER_PRINCIPAL, compare=False)
    apps: JobTable = field(default_factory=JobTable)
    #: The newest running time recorded (running time goes on from it after a restart).
    running_ms: int = 0
    #: ``allocated_ms`` of the last job record (job time a restart knows had come).
    last_allocated_ms: int = 0
    #: Running time at which start-up cut a damaged tail (-1: never): the quarantine's start.
    damaged_tail_running_ms: int = -1
    clock: JobClock = field(default_factory=JobClock, compare=False, repr=False)
    #: Set by :meth:`start`: the running time this process started at, and the job time of
    #: the newest job record then.
    _started_running_ms: int = field(default=0, compare=False, repr=False)
    _started_behind_ms: int = field(default=0, compare=False, repr=False)

    def start(self, wall_ms: int, mono_ms: int) -> None:
        """Start-up, after recovery: job time from the wall clock, running time from the
        newest recorded (a new log: from the wall clock)."""
        running = self.running_ms + 1 if self.running_ms else wall_ms
        self.clock.anchor(wall_ms, mono_ms, running)
        self._started_running_ms = running
        self._started_behind_ms = self.last_allocated_ms

    # -- decisions ------------------------------------------------------------------------

    def refusal(self, app_id: str, principal: str) -> ErrorCode:
        """Whether ``principal`` may name ``app_id`` (past its ACL): ErrorCode.none; else
        INVALID_REQUEST for a name longer than ``max_app_id_bytes``, and
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED when another principal owns it."""
        if _longer_than(app_id, self.max_app_id_bytes):
            return ErrorCode.invalid_request
        held = self.apps.get(app_id)
        if held is not None and held.owner is not None and held.owner != principal:
            return ErrorCode.transactional_id_authorization_failed
        return ErrorCode.none

    def allocate(
        self,
        key: JobKey,
        *,
        wall_ms: int,
        mono_ms: int,
        principal: str,
        client_id: str | None,
    ) -> ControllerResult[Block]:
        """Block ``key.block`` of the app's version: the recorded one again, or a new grant
        recorded under the key; refusals as the module says, each recording nothing."""
        if self.producer_ids.leased:
            return answer(_INVALID)  # a fleet: see the module's doc
        refused = self.refusal(key.app_id, principal)
        if refused:
            return answer(Block(refused))
        job_ms = self.clock.job_ms(wall_ms, mono_ms)
        running_ms = self.clock.running_ms(wall_ms, mono_ms)
        held = self.apps.get(key.app_id)
        if held is not None and key.version < held.version:
            return answer(_FENCED)
        if held is not None and key.version == held.version:
            if not self._reusable(held, job_ms, key.max_age_ms):
                return answer(_UNKNOWN_AGE)
            if key.block < held.block_count:
                return answer(Block(ErrorCode.none, held.block(key.block), BLOCK_SIZE))
            wanted = held.block_count
            stamps = (held.allocated_ms, held.running_ms, held.owner)
        else:
            # The principal is to own one app id more (or an app id of no one's).
            claims = held is None or held.owner is None
            if claims and self.apps.held_by(principal) >= self.max_app_ids_per_principal:
                return answer(_TOO_MANY)
            wanted = 0
            stamps = (job_ms, running_ms, principal)
        if key.block != wanted:  # blocks are asked for in order
            return answer(_INVALID)
        if self._quarantined(running_ms):
            return answer(_UNKNOWN_AGE)  # its record may be in the lost tail
        granted = self.producer_ids.allocate_for_job(principal=principal, client_id=client_id)
        block = granted.response
        if block.error:
            return granted
        allocated_ms, running_stamp, owner = stamps
        record = JobBlockRecorded(
            key.app_id, key.version, key.block, block.first, allocated_ms, owner, running_stamp
        )
        return ControllerResult((*granted.records, record), block)

    def _reusable(self, held: AppVersion, job_ms: int, max_age_ms: int | None = None) -> bool:
        """Whether the version's age is known and within ``reuse_ms`` (and the key's
        ``max_age_ms``, the brokers' expiration, when it carries one). Unknown: stamped
        ahead of job time; or recorded before this start while job time is behind the
        newest job record then (the clock went back while the controller was down, or that
        record was stamped ahead)."""
        if job_ms < held.allocated_ms:
            return False
        if held.running_ms < self._started_running_ms and job_ms < self._started_behind_ms:
            return False
        reuse = self.reuse_ms if max_age_ms is None else min(self.reuse_ms, max_age_ms)
        return job_ms - held.allocated_ms <= reuse

    def _quarantined(self, running_ms: int) -> bool:
        start = self.damaged_tail_running_ms
        return start >= 0 and running_ms - start < self.reuse_ms

    def expire(
        self, wall_ms: int, mono_ms: int, limit: int = DEFAULT_EXPIRY_BATCH
    ) -> ControllerResult[int]:
        """An expiry for each of (at most ``limit``) app ids whose latest version is older
        than ``expiration_ms`` of running time; fewer than ``limit``: none is left. And,
        while app ids are held, the running time now, every :data:`CLOCK_RECORD_INTERVAL_MS`
        (or tenth of ``expiration_ms``)."""
        running_ms = self.clock.running_ms(wall_ms, mono_ms)
        expired = self.apps.expired(running_ms - self.expiration_ms, limit)
        records: list[Record] = [JobAllocationExpired(app, version) for app, version in expired]
        held = len(expired) < len(self.apps) or self.damaged_tail_running_ms >= 0
        interval = min(CLOCK_RECORD_INTERVAL_MS, self.expiration_ms // 10)
        if held and running_ms - self.running_ms >= interval:
            records.append(JobClockAdvanced(running_ms))
        return ControllerResult(tuple(records), len(expired))

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply one of this manager's records; checks come before any change."""
        match record:
            case JobBlockRecorded():
                self._replay_block(offset, record)
            case JobAllocationExpired():
                held = self.apps.get(record.app_id)
                if held is None or held.version != record.version:
                    raise InvariantViolation(
                        f"offset {offset}: expires {record.app_id!r} version {record.version}, "
                        "which is not its latest"
                    )
                self.apps.remove(record.app_id)
            case JobClockAdvanced():
                self.running_ms = max(self.running_ms, record.running_ms)
            case DamagedTailTruncated():
                self.damaged_tail_running_ms = max(self.damaged_tail_running_ms, record.running_ms)
                self.running_ms = max(self.running_ms, record.running_ms)
            case JobAllocationsLoaded():  # (a snapshot's)
                try:
                    self.apps.load_packed(
                        base64.b64decode(record.rows), record.count, record.owners
                    )
                except ValueError as e:  # (binascii.Error is one)
                    raise InvariantViolation(f"offset {offset}: {e}") from e
            case JobsState():  # (a snapshot's)
                self.running_ms = max(self.running_ms, record.running_ms)
                self.last_allocated_ms = max(self.last_allocated_ms, record.last_allocated_ms)
                self.damaged_tail_running_ms = max(
                    self.damaged_tail_running_ms, record.damaged_tail_running_ms
                )

    def _replay_block(self, offset: int, record: JobBlockRecorded) -> None:
        held = self.apps.get(record.app_id)
        # Records from before running time was kept: their job time stands in for it.
        running_ms = record.allocated_ms if record.running_ms is None else record.running_ms
        if held is not None and record.version == held.version:
            if record.block != held.block_count:
                raise InvariantViolation(
                    f"offset {offset}: block {record.block} of {record.app_id!r} "
                    f"version {record.version} follows {held.block_count} blocks"
                )
            if record.principal != held.owner:
                raise InvariantViolation(
                    f"offset {offset}: block {record.block} of {record.app_id!r} names "
                    f"{record.principal!r}, but {held.owner!r} owns its version"
                )
            self.apps.add_block(record.app_id, record.first_producer_id)
        else:
            if held is not None and record.version < held.version:
                raise InvariantViolation(
                    f"offset {offset}: {record.app_id!r} version {record.version} is "
                    f"older than its version {held.version}"
                )
            if record.block != 0:
                raise InvariantViolation(
                    f"offset {offset}: a new version of {record.app_id!r} starts at "
                    f"block {record.block}"
                )
            self.apps.put_version(
                record.app_id,
                record.version,
                record.allocated_ms,
                running_ms,
                record.principal,
                record.first_producer_id,
            )
        self.running_ms = max(self.running_ms, running_ms)
        self.last_allocated_ms = record.allocated_ms

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, producer_ids: ProducerIdControlManager) -> JobAllocationManager:
        """A copy later records do not change, made in microseconds whatever it holds
        (:meth:`JobTable.copy`: the shards are shared, and copied on write)."""
        return JobAllocationManager(
            producer_ids,
            self.reuse_ms,
            self.expiration_ms,
            self.max_app_id_bytes,
            self.max_app_ids_per_principal,
            self.apps.copy(),
            self.running_ms,
            self.last_allocated_ms,
            self.damaged_tail_running_ms,
        )

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The app ids restated as records at offset ``at``: their packed rows in chunks,
        then the clocks' durable values and the quarantine."""
        for count, owners, rows in self.apps.packed_chunks(SNAPSHOT_CHUNK_BYTES):
            yield at, JobAllocationsLoaded(count, owners, base64.b64encode(rows).decode("ascii"))
        yield at, JobsState(self.running_ms, self.last_allocated_ms, self.damaged_tail_running_ms)


def _longer_than(text: str, most_bytes: int) -> bool:
    """Whether ``text`` takes more than ``most_bytes`` in UTF-8 (cheap first: a str of n
    characters takes at most 4n bytes)."""
    return len(text) * 4 > most_bytes and len(text.encode("utf-8", "surrogatepass")) > most_bytes
