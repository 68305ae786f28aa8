"""Producers: InitProducerId, Kafka's TransactionCoordinator rules (its producer-id half).

Owns every transactional id's producer id and epoch (durable) and the controller's own pool
of PIDs for InitProducerId (in memory, refilled by grants in the same result). pidctl keeps
no transactions (it hosts no partitions), so a transactional id is always in Kafka's
``Empty`` state and InitProducerId is only about the producer id and epoch: first use,
re-init (bump, fencing the previous producer), rotation when epochs run out, and the KIP-360
retry and fencing rules when the client sends its current (producer id, epoch).
"""

from __future__ import annotations

import base64
import operator
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.blocks import ProducerIdPool
from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    EPOCH_EXHAUSTED,
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
)
from pidctl.controller.core.producer_ids import ProducerIdControlManager
from pidctl.controller.core.records import (
    SNAPSHOT_CHUNK_BYTES,
    DamagedTailTruncated,
    Record,
    TransactionalIdExpired,
    TransactionalIdsLoaded,
    TransactionalIdUpdated,
    TransactionsState,
)
from pidctl.controller.core.result import ControllerResult, answer


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class TransactionalIdState:
    """What pidctl keeps per transactional id (all of it in the log and in snapshots).

    One is made from its packed row on every InitProducerId of a transactional id."""

    producer_id: Final[int]
    producer_epoch: Final[int]
    previous_producer_id: Final[int]
    last_producer_epoch: Final[int]
    timeout_ms: Final[int]
    updated_ms: Final[int]

    def __init__(
        self,
        producer_id: int,
        producer_epoch: int,
        previous_producer_id: int,
        last_producer_epoch: int,
        timeout_ms: int,
        updated_ms: int,
    ) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.previous_producer_id = previous_producer_id
        self.last_producer_epoch = last_producer_epoch
        self.timeout_ms = timeout_ms
        self.updated_ms = updated_ms


#: One transactional id's state, packed: producer id, epoch, previous producer id, last epoch,
#: timeout, and the last update's milliseconds in 48 bits (high 16, low 32). One bytes object
#: instead of an object and five ints; 30 bytes, so that with its 33-byte header it fits the
#: allocator's 64-byte size class (32 bytes took the 72-byte one): a controller holding a
#: million transactional ids keeps about 160 bytes for each, its id and dict slot included.
_PACKED: Final = struct.Struct("<qhqhiHI")
#: ``updated_ms`` must be below this (2**48 ms after 1970: the year 10889).
MAX_UPDATED_MS: Final = 1 << 48
#: Where a row keeps ``updated_ms`` (high 16 bits, low 32), read without unpacking the rest.
_UPDATED: Final = struct.Struct("<HI")
_UPDATED_AT: Final = _PACKED.size - _UPDATED.size
#: Default of the ``transactional_id_expiry_batch`` setting: expiry records decided (and
#: written) in one step before other work runs; a step costs ~5 µs per id here.
DEFAULT_EXPIRY_BATCH: Final = 1000


def _pack(fields: StateFields) -> bytes:
    producer_id, epoch, previous, last, timeout_ms, updated_ms = fields
    if not 0 <= updated_ms < MAX_UPDATED_MS:
        raise ValueError(f"updated_ms {updated_ms} is outside [0, 2**48)")
    return _PACKED.pack(
        producer_id, epoch, previous, last, timeout_ms, updated_ms >> 32, updated_ms & 0xFFFFFFFF
    )


#: A state's fields, in :class:`TransactionalIdState`'s order.
StateFields = tuple[int, int, int, int, int, int]
#: The :data:`StateFields` of a :class:`TransactionalIdState`, or of a
#: :class:`TransactionalIdUpdated` record (the same attributes), without making a state.
state_fields: Final[Callable[[TransactionalIdState | TransactionalIdUpdated], StateFields]] = (
    operator.attrgetter(
        "producer_id",
        "producer_epoch",
        "previous_producer_id",
        "last_producer_epoch",
        "timeout_ms",
        "updated_ms",
    )
)


def _unpack(row: bytes) -> TransactionalIdState:
    pid, epoch, previous, last, timeout_ms, high, low = _PACKED.unpack(row)
    return TransactionalIdState(pid, epoch, previous, last, timeout_ms, high << 32 | low)


def _updated_ms(row: bytes) -> int:
    high, low = _UPDATED.unpack_from(row, _UPDATED_AT)
    return int(high << 32 | low)


_PRODUCER_ID: Final = struct.Struct("<q")  # a row's first field

#: Length of a transactional id in UTF-8 in :meth:`TransactionalIdTable.packed` (ids are at
#: most ``MAX_TRANSACTIONAL_ID_BYTES``, 32767).
_KEY_LENGTH: Final = struct.Struct("<H")


class TransactionalIdTable:
    """transactional id → :class:`TransactionalIdState`, each state stored packed.

    The ids are kept in the order of their last update (an update moves its id to the end:
    a dict keeps insertion order), which is the order of ``updated_ms`` as long as no update
    is dated before the one made last (the manager dates them so). Expiry then reads the
    oldest ids from the front (:meth:`oldest`) and stops at the first one still in use: it
    costs what expires, not what is held, and needs no index beside the rows."""

    __slots__ = ("_rows",)

    def __init__(self, rows: dict[str, bytes] | None = None) -> None:
        self._rows: dict[str, bytes] = {} if rows is None else rows

    def get(self, transactional_id: str) -> TransactionalIdState | None:
        row = self._rows.get(transactional_id)
        return None if row is None else _unpack(row)

    def __getitem__(self, transactional_id: str) -> TransactionalIdState:
        return _unpack(self._rows[transactional_id])

    def producer_id_of(self, transactional_id: str) -> int | None:
        """The id's producer id (None if it is not held), read alone from its row."""
        row = self._rows.get(transactional_id)
        return None if row is None else int(_PRODUCER_ID.unpack_from(row)[0])

    def __setitem__(self, transactional_id: str, state: TransactionalIdState) -> None:
        """Store ``state``; ValueError if a field does not fit its packed width."""
        self.put(transactional_id, state_fields(state))

    def put(self, transactional_id: str, fields: StateFields) -> None:
        """Store the state of these fields (a record's, without making a
        :class:`TransactionalIdState`: what replay does per record). ValueError if a field
        does not fit its packed width."""
        try:
            row = _pack(fields)
        except struct.error as e:
            raise ValueError(f"transactional id {transactional_id!r}: {e}") from e
        rows = self._rows
        rows.pop(transactional_id, None)  # to the end: the order of last updates
        rows[transactional_id] = row

    def latest_updated_ms(self) -> int:
        """``updated_ms`` of the id updated last (0 when there is none)."""
        if not self._rows:
            return 0
        return _updated_ms(next(reversed(self._rows.values())))

    def oldest(self, before_ms: int, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` ids last updated before ``before_ms``, oldest first, with their
        producer ids: read from the front, up to the first id updated since. An id whose
        update was dated before an earlier one's (a log written before updates were dated
        in order) waits behind it: it expires late, never early."""
        found: list[tuple[str, int]] = []
        if limit <= 0:
            return found
        producer_id = _PRODUCER_ID.unpack_from
        for transactional_id, row in self._rows.items():
            if _updated_ms(row) >= before_ms:
                break
            found.append((transactional_id, producer_id(row)[0]))
            if len(found) >= limit:
                break
        return found

    def __delitem__(self, transactional_id: str) -> None:
        del self._rows[transactional_id]

    def __contains__(self, transactional_id: object) -> bool:
        return transactional_id in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def items(self) -> Iterator[tuple[str, TransactionalIdState]]:
        for transactional_id, row in self._rows.items():
            yield transactional_id, _unpack(row)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransactionalIdTable) and self._rows == other._rows

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> TransactionalIdTable:
        """A copy later changes do not reach (the rows are immutable bytes)."""
        return TransactionalIdTable(dict(self._rows))

    def packed_chunks(self, most_bytes: int) -> Iterator[tuple[int, bytearray]]:
        """Every id and its row, packed, in chunks of about ``most_bytes`` (a row never
        split), in the order of their last updates: per id a u16 (little-endian) length,
        the id in UTF-8, then its 30-byte row. Each chunk with how many ids it holds. Built
        without an object per id, so a snapshot of a million ids costs its buffers, not a
        million lists."""
        out = bytearray()
        count = 0
        length = _KEY_LENGTH.pack
        for transactional_id, row in self._rows.items():
            key = transactional_id.encode("utf-8", "surrogatepass")
            if out and len(out) + _KEY_LENGTH.size + len(key) + len(row) > most_bytes:
                yield count, out
                out, count = bytearray(), 0
            out += length(len(key))
            out += key
            out += row
            count += 1
        if out:
            yield count, out

    def load_packed(self, data: bytes | bytearray | memoryview, count: int) -> None:
        """Append the ``count`` ids (none held yet) of a chunk :meth:`packed_chunks` wrote;
        ValueError, with nothing kept of it, if it does not hold that."""
        view = memoryview(data)
        size = len(view)
        loaded: dict[str, bytes] = {}
        key_length = _KEY_LENGTH.unpack_from
        key_bytes = _KEY_LENGTH.size
        row_bytes = _PACKED.size
        position = 0
        while position < size:
            if size - position < key_bytes:
                raise ValueError(f"packed transactional ids: truncated at byte {position}")
            key_start = position + key_bytes
            row_start = key_start + key_length(view, position)[0]
            position = row_start + row_bytes
            if position > size:
                raise ValueError(f"packed transactional ids: truncated at byte {key_start}")
            loaded[str(view[key_start:row_start], "utf-8", "surrogatepass")] = bytes(
                view[row_start:position]
            )
        if len(loaded) != count:
            raise ValueError(f"packed transactional ids: {len(loaded)} distinct, expected {count}")
        if not self._rows.keys().isdisjoint(loaded):
            raise ValueError("packed transactional ids: an id held already")
        self._rows.update(loaded)


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (see above)
class ProducerIdAndEpoch:
    """InitProducerId's answer (-1, -1 with an error)."""

    error: Final[ErrorCode]
    producer_id: Final[int]
    producer_epoch: Final[int]

    def __init__(
        self,
        error: ErrorCode = ErrorCode.none,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> None:
        self.error = error
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch


def parse_expected(producer_id: int, producer_epoch: int) -> tuple[int, int] | ErrorCode | None:
    """KafkaApis: (-1, -1) means none given; exactly one of them -1 is INVALID_REQUEST."""
    if producer_id == NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH:
        return None
    if producer_id == NO_PRODUCER_ID or producer_epoch == NO_PRODUCER_EPOCH:
        return ErrorCode.invalid_request
    return producer_id, producer_epoch


_NO_PID: Final = ProducerIdAndEpoch(ErrorCode.coordinator_load_in_progress)
#: ErrorCode.none, looked up once: a member read through its enum class costs ~120 ns (the
#: metaclass is searched first), and every InitProducerId answers with it.
_NO_ERROR: Final = ErrorCode.none

#: Longest transactional id accepted, in UTF-8 bytes: the most a (non-flexible) Kafka
#: STRING carries. Its record stays far below the log's record limit even when every byte
#: needs escaping; a longer id is answered INVALID_REQUEST and nothing is written.
MAX_TRANSACTIONAL_ID_BYTES: Final = 32767


@dataclass(slots=True)
class TransactionControlManager:
    """Transactional ids (durable) and the InitProducerId pool (in memory)."""

    producer_ids: ProducerIdControlManager = field(compare=False, repr=False)
    node_id: int = field(default=1, compare=False)
    max_timeout_ms: int = field(default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MS, compare=False)
    expiration_ms: int = field(default=DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS, compare=False)
    transactional_ids: TransactionalIdTable = field(default_factory=TransactionalIdTable)
    pool: ProducerIdPool = field(default_factory=ProducerIdPool, compare=False, repr=False)
    #: A transactional id last updated at or before this (ms, ``updated_ms``) may have lost
    #: its newest update with a damaged tail of the log: it moves to a new producer id at
    #: its next InitProducerId rather than be given an epoch it may already have had. -1:
    #: no damaged tail was ever cut.
    rotate_updated_at_or_before_ms: int = -1

    # -- decisions ------------------------------------------------------------------------

    def init_idempotent(self) -> ControllerResult[ProducerIdAndEpoch]:
        """A fresh PID with epoch 0; nothing persisted but a pool refill's grant. Never
        15/16 when no PID is ready (kafka-python would look for a coordinator): 14."""
        run = self.init_idempotent_run(1)
        taken = run.response
        response = ProducerIdAndEpoch(_NO_ERROR, taken[0], 0) if taken else _NO_PID
        return ControllerResult(run.records, response)

    def init_idempotent_run(self, most: int) -> ControllerResult[range]:
        """A run of idempotent InitProducerIds decided at once: the first one's pool refill
        (as :meth:`init_idempotent`) and the PIDs of up to ``most`` of them, taken while no
        further refill would be decided (:meth:`ProducerIdPool.take_run`): the same PIDs and
        records as that many :meth:`init_idempotent` calls, each applied before the next.
        Fewer PIDs than ``most``: the caller applies the result and asks again for the
        rest; none: no PID is ready (14 for the rest)."""
        refill = self._refill()
        return ControllerResult(refill, self.pool.take_run(most))

    def init_transactional(
        self,
        transactional_id: str,
        *,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        now_ms: int,
    ) -> ControllerResult[ProducerIdAndEpoch]:
        """InitProducerId for a transactional id (its name and ACLs already checked)."""
        if transactional_id == "" or _too_long(transactional_id):
            return answer(ProducerIdAndEpoch(ErrorCode.invalid_request))
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return answer(ProducerIdAndEpoch(ErrorCode.invalid_transaction_timeout))
        now_ms = self._update_time(now_ms)
        current = self.transactional_ids.get(transactional_id)
        refill: tuple[Record, ...] = ()
        if current is None:
            refill = self._refill()
            pid = self.pool.take()
            if pid is None:
                return ControllerResult(refill, _NO_PID)
            # As Kafka: new metadata starts at epoch -1, so the bump below makes it 0.
            current = TransactionalIdState(
                pid, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, timeout_ms, now_ms
            )

        if expected is not None and not _is_valid_producer_id(current, expected):
            return ControllerResult(refill, ProducerIdAndEpoch(ErrorCode.producer_fenced))

        if current.updated_ms <= self.rotate_updated_at_or_before_ms:
            # Its newest update may be in the damaged tail start-up cut: the next epoch may
            # have been handed out already. A new producer id, unless the producer presents
            # an epoch older than even the one in the log (fenced, as it would be anyway).
            stale = expected is not None and expected[1] < current.producer_epoch
            if stale and expected is not None and expected[1] != current.last_producer_epoch:
                return ControllerResult(refill, ProducerIdAndEpoch(ErrorCode.producer_fenced))
            refill = self._refill()
            pid = self.pool.take()
            if pid is None:
                return ControllerResult(refill, _NO_PID)
            return _transition(
                refill, transactional_id, current, pid, 0, NO_PRODUCER_EPOCH, timeout_ms, now_ms
            )

        exhausted = current.producer_epoch >= EPOCH_EXHAUSTED
        if exhausted and (expected is None or expected[1] == current.producer_epoch):
            refill = self._refill()
            pid = self.pool.take()
            if pid is None:
                return ControllerResult(refill, _NO_PID)
            last = current.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
            return _transition(refill, transactional_id, current, pid, 0, last, timeout_ms, now_ms)

        bumped = current.producer_epoch + 1
        if expected is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif current.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == current.producer_epoch:
            # The producer continues after an error and nobody else has initialised since.
            epoch, last = bumped, current.producer_epoch
        elif expected[1] == current.last_producer_epoch:
            # A retry of a bump that already happened: the same answer again. Kafka rewrites
            # the unchanged metadata; pidctl writes nothing, so the previous producer id that
            # makes a retry across a rotation valid is kept for further retries.
            same = ProducerIdAndEpoch(ErrorCode.none, current.producer_id, current.producer_epoch)
            return ControllerResult(refill, same)
        else:
            return ControllerResult(refill, ProducerIdAndEpoch(ErrorCode.producer_fenced))
        return _transition(
            refill, transactional_id, current, current.producer_id, epoch, last, timeout_ms, now_ms
        )

    def expire(self, now_ms: int, limit: int = DEFAULT_EXPIRY_BATCH) -> ControllerResult[int]:
        """An expiry for each of the (at most ``limit``) transactional ids unused longest,
        if unused past ``expiration_ms``; fewer than ``limit`` means none is left to
        expire. Costs what it expires (:meth:`TransactionalIdTable.oldest`)."""
        # Unused past the expiration: now_ms - updated_ms > expiration_ms.
        expired = self.transactional_ids.oldest(now_ms - self.expiration_ms, limit)
        records = tuple(TransactionalIdExpired(tid, pid) for tid, pid in expired)
        return ControllerResult(records, len(records))

    def _update_time(self, now_ms: int) -> int:
        """The ``updated_ms`` of an update now: never before the last update's, so the
        table stays in the order of ``updated_ms`` (a wall clock set back, even before
        1970, dates updates at the last update's time instead: their ids expire late,
        never early), after the damaged tail's bound (an id updated since is not moved
        again), and within what a row holds."""
        latest = max(
            self.transactional_ids.latest_updated_ms(), self.rotate_updated_at_or_before_ms + 1
        )
        return min(max(now_ms, latest), MAX_UPDATED_MS - 1)

    def _refill(self) -> tuple[Record, ...]:
        """A grant for the pool once it wants one (KIP-730's 90% rule). The pool holds the
        block at once: the controller applies the result as a whole, and every answer
        waits until all records decided before it are durable."""
        if not self.pool.wants_block():
            return ()
        grant = self.producer_ids.allocate_for_controller(self.node_id)
        if grant.records:
            self.pool.add_block(grant.response.first, grant.response.length)
        return grant.records

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply one of this manager's records; checks come before any change."""
        match record:
            case TransactionalIdUpdated():
                if not 0 <= record.producer_id < self.producer_ids.next_producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: transactional id {record.transactional_id!r} uses "
                        f"producer id {record.producer_id}, which was never granted"
                    )
                if not 0 <= record.producer_epoch < MAX_PRODUCER_EPOCH:
                    raise InvariantViolation(f"offset {offset}: invalid epoch")
                try:
                    # The record's fields straight into the row (no state object between).
                    self.transactional_ids.put(record.transactional_id, state_fields(record))
                except ValueError as e:  # a field too wide for its row: stored nothing
                    raise InvariantViolation(f"offset {offset}: {e}") from e
            case TransactionalIdExpired():
                held = self.transactional_ids.get(record.transactional_id)
                if held is None or held.producer_id != record.producer_id:
                    raise InvariantViolation(
                        f"offset {offset}: expires transactional id "
                        f"{record.transactional_id!r}, which is not held"
                    )
                del self.transactional_ids[record.transactional_id]
            case DamagedTailTruncated():
                self.rotate_updated_at_or_before_ms = max(
                    self.rotate_updated_at_or_before_ms, record.updated_ms
                )
            case TransactionalIdsLoaded():  # (a snapshot's)
                try:
                    self.transactional_ids.load_packed(base64.b64decode(record.rows), record.count)
                except ValueError as e:  # (binascii.Error is one)
                    raise InvariantViolation(f"offset {offset}: {e}") from e
            case TransactionsState():  # (a snapshot's)
                self.rotate_updated_at_or_before_ms = max(
                    self.rotate_updated_at_or_before_ms, record.rotate_updated_at_or_before_ms
                )

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, producer_ids: ProducerIdControlManager) -> TransactionControlManager:
        """A copy later records do not change: the packed rows are immutable, so copying the
        dict suffices (tens of ms for a million ids; the snapshot is built off the loop)."""
        return TransactionControlManager(
            producer_ids,
            self.node_id,
            self.max_timeout_ms,
            self.expiration_ms,
            self.transactional_ids.copy(),
            rotate_updated_at_or_before_ms=self.rotate_updated_at_or_before_ms,
        )

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The transactional ids restated as records at offset ``at``: their packed rows in
        chunks, then the damaged tail's bound, if one was cut."""
        for count, rows in self.transactional_ids.packed_chunks(SNAPSHOT_CHUNK_BYTES):
            yield at, TransactionalIdsLoaded(count, base64.b64encode(rows).decode("ascii"))
        if self.rotate_updated_at_or_before_ms >= 0:
            yield at, TransactionsState(self.rotate_updated_at_or_before_ms)


def _too_long(transactional_id: str) -> bool:
    # Cheap first: a str of n characters is at most 4n UTF-8 bytes.
    if len(transactional_id) * 4 <= MAX_TRANSACTIONAL_ID_BYTES:
        return False
    return len(transactional_id.encode("utf-8", "surrogatepass")) > MAX_TRANSACTIONAL_ID_BYTES


def _is_valid_producer_id(current: TransactionalIdState, expected: tuple[int, int]) -> bool:
    pid, epoch = expected
    return (
        current.producer_epoch == NO_PRODUCER_EPOCH  # just created: a recovering producer
        or pid == current.producer_id
        or (pid == current.previous_producer_id and epoch >= EPOCH_EXHAUSTED)
    )


def _transition(
    refill: tuple[Record, ...],
    transactional_id: str,
    current: TransactionalIdState,
    producer_id: int,
    epoch: int,
    last_epoch: int,
    timeout_ms: int,
    now_ms: int,
) -> ControllerResult[ProducerIdAndEpoch]:
    record = TransactionalIdUpdated(
        transactional_id,
        producer_id,
        epoch,
        # As Kafka's TxnTransitMetadata: the previous id is the one held before this change.
        current.producer_id,
        last_epoch,
        timeout_ms,
        now_ms,
    )
    return ControllerResult((*refill, record), ProducerIdAndEpoch(_NO_ERROR, producer_id, epoch))
