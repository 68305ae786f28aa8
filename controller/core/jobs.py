"""Job allocations: the producer-id blocks a named job version holds, so that a re-run of the
same version gets the same PIDs back.

A Spark job that writes to Kafka with preallocated PIDs (``format("pidctl-kafka")``) writes
nothing twice on a re-run only if the re-run produces with the *same* PIDs: the brokers then
recognise what the first run wrote by the PIDs' sequences. So a job may name itself — an app
id and a version, Delta Lake's ``txnAppId``/``txnVersion``, or a streaming query's id and
batch id — and pidctl records which blocks that version got, under that name, in the log.

The name travels in the request header's client id (:func:`parse_job_key`), with Kafka's
AllocateProducerIds v0 body unchanged: BrokerId -1 and BrokerEpoch -1 mark a job as before.
A version's blocks are asked for in order (block 0, 1, ...): a block already recorded is
answered again and nothing is written; the next one is granted from the producer-id manager
and recorded beside the grant. Per app id only the latest version is kept:

- an older version is refused PRODUCER_FENCED: a later version of the app has run;
- the same version longer than ``reuse_ms`` after its first block is refused
  UNKNOWN_PRODUCER_ID: the brokers keep a PID's sequences only ``producer.id.expiration.ms``
  after its last write, so a re-run past that could no longer tell what the first run wrote;
- an app id whose latest version is older than ``expiration_ms`` is forgotten (a record
  says so, :meth:`JobAllocationManager.expire`); a later request with it starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.controller.core.producer_ids import Block, ProducerIdControlManager
from pidctl.controller.core.records import JobAllocationExpired, JobBlockRecorded
from pidctl.controller.core.result import ControllerResult, answer

#: The client id of a keyed job request: ``pidctl-job/<version>/<block>/<app id>``. The app
#: id comes last, so it may hold any character, the slash too.
JOB_KEY_PREFIX = "pidctl-job/"
#: Default of ``job_allocation_reuse_ms``: Kafka's ``producer.id.expiration.ms`` default (one
#: day), how long a broker keeps a silent PID's sequences.
DEFAULT_REUSE_MS = 86_400_000
#: Default of ``job_allocation_expiration_ms``: Kafka's ``transactional.id.expiration.ms``.
DEFAULT_EXPIRATION_MS = 7 * 24 * 3600 * 1000
#: Default of ``job_allocation_expiry_batch``: app ids forgotten in one step.
DEFAULT_EXPIRY_BATCH = 1000
#: Most blocks one job version may hold (a million partitions): bounds what one app id keeps.
MAX_BLOCKS_PER_VERSION = 1000


@dataclass(frozen=True, slots=True)
class JobKey:
    """Which block of which version of which app a keyed job request asks for."""

    app_id: str
    version: int
    block: int

    def client_id(self) -> str:
        """The client id that carries this key on the wire."""
        return f"{JOB_KEY_PREFIX}{self.version}/{self.block}/{self.app_id}"


#: What a client id's bytes that are not UTF-8 are read as (U+FFFD, the replacement
#: character): a job key holding it is refused.
UNREADABLE = "\ufffd"


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
    if not (version.isdigit() and block.isdigit() and version.isascii() and block.isascii()):
        raise ValueError(f"job key {client_id!r}: version and block must be non-negative")
    if int(version) >= 2**63 or int(block) >= MAX_BLOCKS_PER_VERSION:
        raise ValueError(
            f"job key {client_id!r}: version below 2^63, block below {MAX_BLOCKS_PER_VERSION}"
        )
    return JobKey(app_id, int(version), int(block))


@dataclass(slots=True)
class AppAllocation:
    """An app id's latest version: its blocks' first PIDs in block order, and when its first
    block was recorded (wall ms)."""

    version: int
    blocks: list[int]
    allocated_ms: int


@dataclass(slots=True)
class JobAllocationManager:
    """The blocks each app id's latest version holds."""

    producer_ids: ProducerIdControlManager = field(compare=False, repr=False)
    reuse_ms: int = field(default=DEFAULT_REUSE_MS, compare=False)
    expiration_ms: int = field(default=DEFAULT_EXPIRATION_MS, compare=False)
    #: In the order of ``allocated_ms`` (a new version moves its app id to the end), so an
    #: expiry reads from the front and stops at the first app id still in use.
    apps: dict[str, AppAllocation] = field(default_factory=dict)

    # -- decisions ------------------------------------------------------------------------

    def allocate(
        self, key: JobKey, *, now_ms: int, principal: str, client_id: str | None
    ) -> ControllerResult[Block]:
        """Block ``key.block`` of the app's version: the recorded one again, or a new grant
        recorded under the key; refusals as the module says."""
        held = self.apps.get(key.app_id)
        if held is not None and key.version < held.version:
            return answer(Block(ErrorCode.producer_fenced))
        if held is not None and key.version == held.version:
            if now_ms - held.allocated_ms > self.reuse_ms:
                return answer(Block(ErrorCode.unknown_producer_id))
            if key.block < len(held.blocks):
                return answer(Block(ErrorCode.none, held.blocks[key.block], BLOCK_SIZE))
            wanted = len(held.blocks)
        else:
            wanted = 0
        if key.block != wanted:  # blocks are asked for in order
            return answer(Block(ErrorCode.invalid_request))
        granted = self.producer_ids.allocate_for_job(principal=principal, client_id=client_id)
        block = granted.response
        if block.error:
            return granted
        recorded_ms = max([now_ms] + [app.allocated_ms for app in self._newest()])
        record = JobBlockRecorded(key.app_id, key.version, key.block, block.first, recorded_ms)
        return ControllerResult((*granted.records, record), block)

    def expire(self, now_ms: int, limit: int = DEFAULT_EXPIRY_BATCH) -> ControllerResult[int]:
        """An expiry for each of the (at most ``limit``) app ids whose latest version is
        older than ``expiration_ms``, oldest first; fewer than ``limit``: none is left."""
        records: list[JobAllocationExpired] = []
        for app_id, held in self.apps.items():
            if len(records) == limit or now_ms - held.allocated_ms <= self.expiration_ms:
                break
            records.append(JobAllocationExpired(app_id, held.version))
        return ControllerResult(tuple(records), len(records))

    def _newest(self) -> list[AppAllocation]:
        return [self.apps[next(reversed(self.apps))]] if self.apps else []

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply one of this manager's records; checks come before any change."""
        match record:
            case JobBlockRecorded():
                held = self.apps.get(record.app_id)
                if held is not None and record.version == held.version:
                    if record.block != len(held.blocks):
                        raise InvariantViolation(
                            f"offset {offset}: block {record.block} of {record.app_id!r} "
                            f"version {record.version} follows {len(held.blocks)} blocks"
                        )
                    held.blocks.append(record.first_producer_id)
                    return
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
                self.apps.pop(record.app_id, None)
                self.apps[record.app_id] = AppAllocation(
                    record.version, [record.first_producer_id], record.allocated_ms
                )
            case JobAllocationExpired():
                held = self.apps.get(record.app_id)
                if held is None or held.version != record.version:
                    raise InvariantViolation(
                        f"offset {offset}: expires {record.app_id!r} version {record.version}, "
                        "which is not its latest"
                    )
                del self.apps[record.app_id]

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, producer_ids: ProducerIdControlManager) -> JobAllocationManager:
        return JobAllocationManager(
            producer_ids,
            self.reuse_ms,
            self.expiration_ms,
            {
                app_id: AppAllocation(held.version, list(held.blocks), held.allocated_ms)
                for app_id, held in self.apps.items()
            },
        )

    def snapshot_fields(self) -> dict[str, Any]:
        """Per app id, in expiry order: [app id, version, allocated ms, [blocks' first PIDs]]."""
        return {
            "job_allocations": [
                [app_id, held.version, held.allocated_ms, list(held.blocks)]
                for app_id, held in self.apps.items()
            ]
        }

    def restore(self, data: dict[str, Any]) -> None:
        self.apps = {
            app_id: AppAllocation(version, list(blocks), allocated_ms)
            for app_id, version, allocated_ms, blocks in data.get("job_allocations", [])
        }
