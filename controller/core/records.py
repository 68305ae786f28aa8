"""Metadata records: the only things written to the log, and the only way state changes.

Each record type is a frozen dataclass with a stable numeric type id (:data:`RECORD_TYPES`).
Its payload on disk is compact JSON of its fields (see ``docs/log-format.md``); adding an
optional field is a compatible change, anything else bumps the record's version.

The two records written on every request (a grant, a transactional id's update) are made
immutable by ``Final`` fields and built by an ``__init__`` of their own instead (the
compiled build's rule 1, ARCHITECTURE.md).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import operator
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pidctl.controller.core.json_encoding import object_encoder


@dataclass(frozen=True, slots=True)
class ClusterCreated:
    """First record of every log: fixes the cluster id for the data dir's lifetime."""

    cluster_id: str
    node_id: int


def new_cluster_id() -> str:
    """A new cluster id as Kafka's ``Uuid.randomUuid()`` makes one: a random (version 4)
    UUID in URL-safe base64 without padding, 22 characters, drawn again while it holds a
    ``-`` (KAFKA-20072; before it, Kafka refused only a leading one): such an id reads as an
    option on a command line (``pidctl register --cluster-id -Xy...`` is refused). Kafka's
    reserved UUIDs (0 and 1) have no version bits, so a version 4 UUID is never one."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if "-" not in cluster_id:
            return cluster_id


@dataclass(frozen=True, slots=True)
class BrokerRegistered:
    """A broker incarnation registered; its epoch is this record's offset (as in KRaft)."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    rack: str | None = None
    listeners: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerUnregistered:
    """A broker's registration was removed (UnregisterBroker)."""

    broker_id: int
    broker_epoch: int


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final: see the module's doc
class ProducerIdsGranted:
    """A block ``[first_producer_id, next_producer_id)`` was granted.

    ``next_producer_id`` is the high-water mark Kafka's ProducerIdsRecord stores; the first id
    is kept as well so the audit trail needs no arithmetic. ``holder`` says who holds the
    block: a ``broker`` (``broker_id``/``broker_epoch``), or the ``controller`` itself (its
    InitProducerId pool; ``broker_id`` is then the controller's node id).
    ``principal``/``client_id`` say over which connection it was asked for.
    """

    broker_id: Final[int]
    broker_epoch: Final[int]
    first_producer_id: Final[int]
    next_producer_id: Final[int]
    principal: Final[str | None]
    client_id: Final[str | None]
    holder: Final[str]

    def __init__(
        self,
        broker_id: int,
        broker_epoch: int,
        first_producer_id: int,
        next_producer_id: int,
        principal: str | None = None,
        client_id: str | None = None,
        holder: str = "broker",
    ) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.first_producer_id = first_producer_id
        self.next_producer_id = next_producer_id
        self.principal = principal
        self.client_id = client_id
        self.holder = holder

    @property
    def last_producer_id(self) -> int:
        """The block's last id (the audit trail's field; not stored)."""
        return self.next_producer_id - 1


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final: see the module's doc
class TransactionalIdUpdated:
    """A transactional id's producer id and epoch after InitProducerId (Kafka's
    TransactionMetadata, minus the transaction state pidctl does not keep)."""

    transactional_id: Final[str]
    producer_id: Final[int]
    producer_epoch: Final[int]
    previous_producer_id: Final[int]
    last_producer_epoch: Final[int]
    timeout_ms: Final[int]
    updated_ms: Final[int]

    def __init__(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        previous_producer_id: int,
        last_producer_epoch: int,
        timeout_ms: int,
        updated_ms: int,
    ) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.previous_producer_id = previous_producer_id
        self.last_producer_epoch = last_producer_epoch
        self.timeout_ms = timeout_ms
        self.updated_ms = updated_ms


@dataclass(frozen=True, slots=True)
class TransactionalIdExpired:
    """A transactional id unused for longer than ``transactional_id_expiration_ms``."""

    transactional_id: str
    producer_id: int


@dataclass(frozen=True, slots=True)
class ControllerStarted:
    """A controller process started on this log: the audit trail's restart marker (blocks
    the controller's own pool held before it are abandoned, as a restarted broker's are)."""

    node_id: int
    software_version: str


@dataclass(frozen=True, slots=True)
class ProducerIdsLeased:
    """A range ``[first_producer_id, next_producer_id)`` leased from the PID source shared
    with other controllers (etcd, see ``docs/fleets.md``), recorded before any of it is granted.

    ``revision`` is the etcd revision of the compare-and-swap that took the range.
    """

    first_producer_id: int
    next_producer_id: int
    source: str
    revision: int = 0


@dataclass(frozen=True, slots=True)
class ProducerIdFloorRaised:
    """The high-water mark was raised to ``next_producer_id`` by an import (``pidctl
    import-zk``): no PID below it will be granted. ``origin`` says where the value came from."""

    next_producer_id: int
    origin: str


@dataclass(frozen=True, slots=True)
class JobBlockRecorded:
    """Block ``block`` of version ``version`` of a job named ``app_id`` is the block starting
    at ``first_producer_id`` (granted by the :class:`ProducerIdsGranted` just before it): a
    re-run of that version gets it back.

    Every block of a version carries the version's: ``allocated_ms``, the job time of its
    first block (the wall clock, never behind the monotonic clock's count since the
    controller started: the reuse window's start); ``running_ms``, the jobs' running time
    then (the expiry's clock: ``core/job_clock.py``); ``principal``, the app id's owner.
    The last two are None in records written before they existed."""

    app_id: str
    version: int
    block: int
    first_producer_id: int
    allocated_ms: int
    principal: str | None = None
    running_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobAllocationExpired:
    """A job's app id unused for longer than ``job_allocation_expiration_ms`` is forgotten,
    with its latest version ``version``."""

    app_id: str
    version: int


@dataclass(frozen=True, slots=True)
class JobClockAdvanced:
    """The jobs' running time reached ``running_ms``: written now and then while app ids are
    held, so that a restart goes on from about here rather than from the last job record
    (``core/job_clock.py``)."""

    running_ms: int


@dataclass(frozen=True, slots=True)
class DamagedTailTruncated:
    """Start-up cut ``truncated_bytes`` off the log's tail: a write a crash cut short, or
    damage to acknowledged records (``docs/log-format.md``, "What a damaged tail cannot
    change"). Job versions not in the log are refused for ``job_allocation_reuse_ms`` of
    running time from ``running_ms``; a transactional id last updated at or before
    ``updated_ms`` moves to a new producer id at its next InitProducerId."""

    truncated_bytes: int
    running_ms: int
    updated_ms: int


@dataclass(frozen=True, slots=True)
class ProducerIdsReserved:
    """No PID at or above ``next_producer_id`` is granted until the next reservation.

    Decided before any grant (or raised floor) that passes the previous reservation, and
    made durable twice: in the data dir's reservation file first, then here. Start-up
    grants from the highest reservation, above anything a lost or damaged tail of the log
    could have granted (``docs/log-format.md``). A clean shutdown lowers it to the
    high-water mark, so that a graceful restart skips nothing."""

    next_producer_id: int


@dataclass(frozen=True, slots=True)
class JobVersionCommitted:
    """Version ``version`` of the job named ``app_id`` completed: every task wrote its rows
    (``core/job_commits.py``). A re-run of it, or of an older version, writes nothing."""

    app_id: str
    version: int


# -- the records only snapshots hold ------------------------------------------------------
#
# A snapshot is records too (``docs/log-format.md``): each manager restates its state as
# records its own ``replay`` applies, the log's where they say it (a broker's registration,
# a lease, the reservation), and these where the log's records are changes, not state. A
# table of many rows is restated in chunks of its packed rows (base64, at most
# ``SNAPSHOT_CHUNK_BYTES`` each), not a record per row: a million transactional ids as
# TransactionalIdUpdated records took 2.3 times the bytes and 3.6 times the start-up.
# They are never written to the log, and replay refuses them there.


@dataclass(frozen=True, slots=True)
class ProducerIdsState:
    """The producer-id manager's high-water mark and how many blocks it granted."""

    next_producer_id: int
    blocks_granted: int


@dataclass(frozen=True, slots=True)
class LeasesState:
    """Whether grants come only from leases, and the end of the highest lease ever taken
    (the leases held are restated as :class:`ProducerIdsLeased` before it)."""

    lease_mode: bool
    highest_lease_end: int


@dataclass(frozen=True, slots=True)
class TransactionalIdsLoaded:
    """``count`` transactional ids and their states: ``rows`` is the base64 of their packed
    rows (``TransactionalIdTable.packed``), in the order of their last update."""

    count: int
    rows: str


@dataclass(frozen=True, slots=True)
class TransactionsState:
    """A transactional id last updated at or before ``rotate_updated_at_or_before_ms`` moves
    to a new producer id at its next InitProducerId (a damaged tail was cut: see
    :class:`DamagedTailTruncated`)."""

    rotate_updated_at_or_before_ms: int


@dataclass(frozen=True, slots=True)
class JobAllocationsLoaded:
    """``count`` app ids' latest versions: ``rows`` is the base64 of their packed rows
    (``JobTable.packed``), whose owner indices point into ``owners`` (index 0: no owner)."""

    count: int
    owners: tuple[str, ...]
    rows: str


@dataclass(frozen=True, slots=True)
class JobsState:
    """The job clocks' durable values and the damaged tail's quarantine (``jobs.py``)."""

    running_ms: int
    last_allocated_ms: int
    damaged_tail_running_ms: int


@dataclass(frozen=True, slots=True)
class JobCommitsLoaded:
    """``count`` app ids' latest committed versions: ``rows`` is the base64 of their packed
    rows (``CommitTable.packed_chunks``). Replayed after the app ids (``JobAllocationsLoaded``)."""

    count: int
    rows: str


Record = (
    ClusterCreated
    | ControllerStarted
    | BrokerRegistered
    | BrokerUnregistered
    | ProducerIdsGranted
    | TransactionalIdUpdated
    | TransactionalIdExpired
    | ProducerIdsLeased
    | ProducerIdFloorRaised
    | JobBlockRecorded
    | JobAllocationExpired
    | ProducerIdsReserved
    | JobClockAdvanced
    | DamagedTailTruncated
    | ProducerIdsState
    | LeasesState
    | TransactionalIdsLoaded
    | TransactionsState
    | JobAllocationsLoaded
    | JobsState
    | JobVersionCommitted
    | JobCommitsLoaded
)

#: Each record type's stable numeric id (the frame's type byte): a record's class is its
#: type, and this table its number (not a class attribute: compiled rule 2).
RECORD_TYPES: Final[dict[int, type[Record]]] = {
    1: ClusterCreated,
    2: BrokerRegistered,
    3: BrokerUnregistered,
    4: ProducerIdsGranted,
    5: TransactionalIdUpdated,
    6: TransactionalIdExpired,
    7: ControllerStarted,
    8: ProducerIdsLeased,
    9: ProducerIdFloorRaised,
    10: JobBlockRecorded,
    11: JobAllocationExpired,
    12: ProducerIdsReserved,
    13: JobClockAdvanced,
    14: DamagedTailTruncated,
    15: ProducerIdsState,
    16: TransactionalIdsLoaded,
    17: TransactionsState,
    18: JobAllocationsLoaded,
    19: JobsState,
    20: LeasesState,
    21: JobVersionCommitted,
    22: JobCommitsLoaded,
}

#: The record types only a snapshot holds: in the log, one is corruption.
SNAPSHOT_RECORDS: Final[frozenset[type[Record]]] = frozenset(
    {
        ProducerIdsState,
        LeasesState,
        TransactionalIdsLoaded,
        TransactionsState,
        JobAllocationsLoaded,
        JobsState,
        JobCommitsLoaded,
    }
)
#: Most bytes of packed rows in one ``...Loaded`` record: in base64 a third more, well
#: within what a record may hold (``logformat.MAX_RECORD_BYTES``, 1 MiB).
SNAPSHOT_CHUNK_BYTES: Final = 512 * 1024

#: :data:`RECORD_TYPES` the other way round: a record class's id.
TYPE_IDS: Final[dict[type[Record], int]] = {cls: number for number, cls in RECORD_TYPES.items()}

#: Version of every record payload written by this code.
RECORD_VERSION: Final = 1


#: Fields that are tuples (JSON has only lists).
_TUPLE_FIELDS: Final = ("listeners", "owners")


class RecordDecodeError(ValueError):
    """A record's payload does not describe a valid record."""


def record_name(record: Record) -> str:
    return type(record).__name__


_Values = Callable[[Any], tuple[Any, ...]]


def _kind(annotation: object) -> str:
    """A field's type as :func:`object_encoder` names it. Interpreted, the annotation's text
    (``"int"``, ``"str | None"``: annotations are not evaluated here), less a ``Final[...]``
    around it; compiled, the class mypyc leaves of it (``int``, ``str``; ``type`` for a
    union, ``tuple``; no ``Final``), whose name is the same for the simple types, and which
    the generic encoder takes for the others."""
    if isinstance(annotation, type):
        return annotation.__name__
    text = str(annotation)
    return text[len("Final[") : -1] if text.startswith("Final[") else text


def _payload_encoder(cls: type[Record]) -> tuple[_Values, Callable[[tuple[Any, ...]], str]]:
    """The record type's field values in declaration order (one ``attrgetter`` call), and
    their compact JSON object through a template built from the fields' annotated types."""
    fields = [(f.name, _kind(f.type)) for f in dataclasses.fields(cls)]
    names = [name for name, _ in fields]
    values: _Values
    if len(names) > 1:
        values = operator.attrgetter(*names)
    else:
        # One name: attrgetter gives the value itself (typed apart: compiled, a tuple is
        # checked for where the call with several names is typed to give one).
        get_one = operator.attrgetter(names[0])
        values = lambda record: (get_one(record),)  # noqa: E731
    return values, object_encoder(fields, separators=(",", ":"))


#: Built once: every request that changes state encodes a record.
_PAYLOAD_ENCODERS: Final = {cls: _payload_encoder(cls) for cls in RECORD_TYPES.values()}


def encode_payload(record: Record) -> bytes:
    """The record's fields as compact JSON (the type id travels in the record header)."""
    values, encode = _PAYLOAD_ENCODERS[type(record)]
    return encode(values(record)).encode()


def decode_payload(record_type: int, payload: bytes) -> Record:
    """Rebuild a record from its type id and payload; raises :class:`RecordDecodeError`."""
    cls = RECORD_TYPES.get(record_type)
    if cls is None:
        raise RecordDecodeError(f"unknown record type {record_type}")
    try:
        fields = json.loads(payload)
        for name in _TUPLE_FIELDS:
            if name in fields:
                fields[name] = tuple(fields[name])
        return cls(**fields)
    except (ValueError, TypeError) as e:
        raise RecordDecodeError(f"bad {cls.__name__} payload: {e}") from e


def record_to_dict(record: Record) -> dict[str, Any]:
    """A JSON-friendly view with the record's type name, for dumps and the Spark reader."""
    return {"type": record_name(record), **dataclasses.asdict(record)}
