"""Job commits: the latest version of each named job that completed, so that a re-run of a
completed version — or of an older one — writes nothing (Delta Lake's rule for
``txnAppId``/``txnVersion``, and the SQL sink's).

A job writing to Kafka with preallocated PIDs (``format("pidctl-kafka")``) gets its
version's blocks by name (``jobs.py``); once every task has written, its driver commits
the version: an AllocateProducerIds (BrokerId -1, BrokerEpoch -1, as every job request) whose
client id is ``pidctl-job/<version>/commit/<app id>`` — the block's place in the key holds
``commit``. The commit is recorded (:class:`JobVersionCommitted`) and answered NONE:

- a version already committed, or older than the one committed: NONE again, nothing written;
- a version older than the app's latest (a later one started since): PRODUCER_FENCED;
- a version pidctl holds no blocks of (never asked for, or forgotten): UNKNOWN_PRODUCER_ID;
- another principal's app id, as for its blocks (``jobs.py``'s owner and ``AppId`` ACL).

A block asked for a committed version (or an older one) is answered
DUPLICATE_SEQUENCE_NUMBER — "what you would write is there already", the broker's word for a
re-sent batch — with the block itself when pidctl still holds it (the version is the app's
latest), so that a verifier can name the version's PIDs; a sink writes nothing. An app id
forgotten by the expiry (``JobAllocationExpired``) forgets its commit too.

The committed versions are kept as the app ids' blocks are (``job_table.py``): in shards
that a snapshot shares and a change copies, so a snapshot copies none of them on the loop.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_table import SHARDS, shard_of
from pidctl.controller.core.jobs import JOB_KEY_PREFIX, UNREADABLE, JobAllocationManager
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.controller.core.producer_ids import Block
from pidctl.controller.core.records import (
    SNAPSHOT_CHUNK_BYTES,
    JobAllocationExpired,
    JobCommitsLoaded,
    JobVersionCommitted,
    Record,
)
from pidctl.controller.core.result import ControllerResult, answer

#: What a commit's key holds where a block request's holds the block number.
COMMIT: Final = "commit"
_PACKED_LENGTH: Final = struct.Struct("<H")
_PACKED_VERSION: Final = struct.Struct("<q")


@dataclass(frozen=True, slots=True)
class CommitKey:
    """The version of an app a commit names."""

    app_id: str
    version: int

    def client_id(self) -> str:
        """The client id that carries this commit on the wire."""
        return f"{JOB_KEY_PREFIX}{self.version}/{COMMIT}/{self.app_id}"


def parse_commit_key(client_id: str | None) -> CommitKey | None:
    """The commit a job's client id carries, None for any other client id (a block request's
    too); raises ValueError for a commit key that is not well formed."""
    if client_id is None or not client_id.startswith(JOB_KEY_PREFIX):
        return None
    parts = client_id[len(JOB_KEY_PREFIX) :].split("/", 2)
    if len(parts) != 3 or parts[1] != COMMIT:
        return None
    version, _, app_id = parts
    if not app_id:
        raise ValueError(f"commit key {client_id!r} is not {JOB_KEY_PREFIX}VERSION/commit/APP_ID")
    if UNREADABLE in client_id:
        raise ValueError(f"commit key {client_id!r} is not UTF-8 (or holds U+FFFD)")
    if not (version.isdigit() and version.isascii()) or int(version) >= 2**63:
        raise ValueError(f"commit key {client_id!r}: the version must be below 2^63")
    return CommitKey(app_id, int(version))


class CommitTable:
    """app id → its latest committed version, in shards copied on write (as ``JobTable``)."""

    __slots__ = ("_shards", "_shared")

    def __init__(self) -> None:
        self._shards: list[dict[str, int]] = [{} for _ in range(SHARDS)]
        self._shared = bytearray(SHARDS)

    def get(self, app_id: str) -> int | None:
        return self._shards[shard_of(app_id)].get(app_id)

    def put(self, app_id: str, version: int) -> None:
        self._writable(shard_of(app_id))[app_id] = version

    def discard(self, app_id: str) -> None:
        index = shard_of(app_id)
        if app_id in self._shards[index]:
            del self._writable(index)[app_id]

    def _writable(self, index: int) -> dict[str, int]:
        shard = self._shards[index]
        if self._shared[index]:
            shard = dict(shard)
            self._shards[index] = shard
            self._shared[index] = 0
        return shard

    def __len__(self) -> int:
        return sum(len(shard) for shard in self._shards)

    def items(self) -> list[tuple[str, int]]:
        return [item for shard in self._shards for item in shard.items()]

    def copy(self) -> CommitTable:
        """A copy later changes do not reach: both share every shard until one changes it."""
        copied = CommitTable.__new__(CommitTable)
        copied._shards = list(self._shards)
        self._shared = bytearray(b"\x01" * SHARDS)
        copied._shared = bytearray(b"\x01" * SHARDS)
        return copied

    def packed_chunks(self, most_bytes: int) -> Iterator[tuple[int, bytearray]]:
        """Every app id and version in chunks of about ``most_bytes`` (an entry never
        split), each with how many app ids it holds: per app id a u16 (little-endian)
        length, the id in UTF-8, an i64."""
        out, count = bytearray(), 0
        for shard in self._shards:
            for app_id, version in shard.items():
                key = app_id.encode("utf-8", "surrogatepass")
                entry = _PACKED_LENGTH.pack(len(key)) + key + _PACKED_VERSION.pack(version)
                if out and len(out) + len(entry) > most_bytes:
                    yield count, out
                    out, count = bytearray(), 0
                out += entry
                count += 1
        if out:
            yield count, out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommitTable) and sorted(self.items()) == sorted(other.items())

    __hash__ = None  # type: ignore[assignment]


def unpack_commits(data: bytes | bytearray | memoryview) -> list[tuple[str, int]]:
    """The app ids and versions of a chunk ``CommitTable.packed_chunks`` wrote; ValueError
    if it is not one."""
    view, at = memoryview(data), 0
    entries: list[tuple[str, int]] = []
    while at < len(view):
        if len(view) - at < _PACKED_LENGTH.size:
            raise ValueError(f"packed job commits: truncated at byte {at}")
        end = at + _PACKED_LENGTH.size + _PACKED_LENGTH.unpack_from(view, at)[0]
        if end + _PACKED_VERSION.size > len(view):
            raise ValueError(f"packed job commits: truncated at byte {at}")
        app_id = str(view[at + _PACKED_LENGTH.size : end], "utf-8", "surrogatepass")
        entries.append((app_id, _PACKED_VERSION.unpack_from(view, end)[0]))
        at = end + _PACKED_VERSION.size
    return entries


@dataclass(slots=True)
class JobCommitManager:
    """The latest committed version of each app id that ``jobs`` holds."""

    jobs: JobAllocationManager = field(compare=False, repr=False)
    committed: CommitTable = field(default_factory=CommitTable)

    # -- decisions ------------------------------------------------------------------------

    def commit(self, key: CommitKey, *, principal: str) -> ControllerResult[Block]:
        """Record that ``key``'s version completed; refusals as the module says, each
        recording nothing."""
        if self.jobs.producer_ids.leased:
            return answer(Block(ErrorCode.invalid_request))  # a fleet serves no named job
        refused = self.jobs.refusal(key.app_id, principal)
        if refused:
            return answer(Block(refused))
        done = self.committed.get(key.app_id)
        if done is not None and key.version <= done:
            return answer(Block())
        held = self.jobs.apps.get(key.app_id)
        if held is None or key.version > held.version:
            return answer(Block(ErrorCode.unknown_producer_id))
        if key.version < held.version:
            return answer(Block(ErrorCode.producer_fenced))
        return ControllerResult((JobVersionCommitted(key.app_id, key.version),), Block())

    def committed_block(self, app_id: str, version: int, block: int) -> Block | None:
        """The answer to a block request of a committed (or older) version: None if the
        version is not covered by a commit."""
        done = self.committed.get(app_id)
        if done is None or version > done:
            return None
        held = self.jobs.apps.get(app_id)
        if held is not None and held.version == version and block < held.block_count:
            return Block(ErrorCode.duplicate_sequence_number, held.block(block), BLOCK_SIZE)
        return Block(ErrorCode.duplicate_sequence_number)

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply a commit, or forget one with its app id; checks come before any change."""
        match record:
            case JobVersionCommitted():
                held = self.jobs.apps.get(record.app_id)
                if held is None or held.version != record.version:
                    raise InvariantViolation(
                        f"offset {offset}: commits {record.app_id!r} version {record.version}, "
                        "which is not its latest"
                    )
                done = self.committed.get(record.app_id)
                if done is not None and record.version <= done:
                    raise InvariantViolation(
                        f"offset {offset}: commits {record.app_id!r} version {record.version} "
                        f"after version {done}"
                    )
                self.committed.put(record.app_id, record.version)
            case JobAllocationExpired():
                self.committed.discard(record.app_id)
            case JobCommitsLoaded():  # (a snapshot's)
                self._replay_loaded(offset, record)

    def _replay_loaded(self, offset: int, record: JobCommitsLoaded) -> None:
        try:
            rows = base64.b64decode(record.rows, validate=True)
            entries = unpack_commits(rows)
        except ValueError as e:  # (binascii.Error is one)
            raise InvariantViolation(f"offset {offset}: {e}") from e
        if len(entries) != record.count:
            raise InvariantViolation(
                f"offset {offset}: {len(entries)} job commits, the record says {record.count}"
            )
        for app_id, version in entries:
            held = self.jobs.apps.get(app_id)
            if held is None or held.version < version:
                raise InvariantViolation(
                    f"offset {offset}: commits {app_id!r} version {version}, "
                    "which pidctl does not hold"
                )
            if self.committed.get(app_id) is not None:
                raise InvariantViolation(f"offset {offset}: commits {app_id!r} twice")
        for app_id, version in entries:
            self.committed.put(app_id, version)

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, jobs: JobAllocationManager) -> JobCommitManager:
        return JobCommitManager(jobs, self.committed.copy())

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The committed versions restated as records at offset ``at``, in chunks of their
        packed rows (replayed after the app ids they belong to)."""
        for count, rows in self.committed.packed_chunks(SNAPSHOT_CHUNK_BYTES):
            yield at, JobCommitsLoaded(count, base64.b64encode(rows).decode("ascii"))
