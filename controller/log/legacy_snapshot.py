"""Snapshots from before snapshots were records (``PIDSNAP1``: JSON; ``PIDSNAP2``: JSON and
raw sections), read as the records a snapshot holds now: the one converter, for upgrades.

Such a snapshot holds each manager's fields under its own names, some missing in older
ones (the defaults below are what the managers assumed then). They become the records
``ControllerState.snapshot_records`` would have written for the same state, so start-up,
``pidctl log dump`` and ``verify`` replay them as they replay any snapshot; the next
snapshot the server writes is records.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any, Final

from pidctl.controller.core.job_table import JobTable
from pidctl.controller.core.logformat import LogCorruption, LogEntry
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    JobAllocationsLoaded,
    JobsState,
    LeasesState,
    ProducerIdsLeased,
    ProducerIdsReserved,
    ProducerIdsState,
    Record,
    TransactionalIdsLoaded,
    TransactionsState,
)
from pidctl.controller.core.transactions import TransactionalIdState, TransactionalIdTable

#: The magics of the snapshot files read here.
PIDSNAP1: Final = b"PIDSNAP1"
PIDSNAP2: Final = b"PIDSNAP2"
LEGACY_MAGICS: Final = (PIDSNAP1, PIDSNAP2)

#: ``PIDSNAP2``: the length of the JSON head before the raw sections.
_JSON_LENGTH: Final = struct.Struct(">I")
#: A table converted from an old snapshot comes whole, in one record: it is never encoded,
#: so no record size applies.
_WHOLE: Final = 1 << 62


def legacy_snapshot_entries(
    path: Path, magic: bytes, body: memoryview, offset: int
) -> list[LogEntry]:
    """The records of an old snapshot's ``body`` (its checksum already checked), each at the
    offset it stands at; :class:`LogCorruption` if it does not parse."""
    try:
        fields = _fields(magic, body)
        said = int(fields["offset"])
        if said != offset:
            raise ValueError(f"it says offset {said}")
        records = list(_records(fields["state"], offset))
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
        raise LogCorruption(f"{path}: snapshot does not parse ({e})") from e
    return [LogEntry(at, 0, record) for at, record in records]


def _fields(magic: bytes, body: memoryview) -> dict[str, Any]:
    """The snapshot's JSON, its raw sections in place of their names (``PIDSNAP2``)."""
    if magic == PIDSNAP1:
        parsed: dict[str, Any] = json.loads(bytes(body))
        return parsed
    (head_length,) = _JSON_LENGTH.unpack_from(body, 0)
    head_end = _JSON_LENGTH.size + head_length
    parsed = json.loads(bytes(body[_JSON_LENGTH.size : head_end]))
    position = head_end
    for name, size in parsed["raw"]:
        parsed["state"][name] = body[position : position + size]
        position += size
    if position != len(body):
        raise ValueError(f"raw sections end at {position} of {len(body)} bytes")
    return parsed


def _records(state: dict[str, Any], at: int) -> list[tuple[int, Record]]:
    if int(state["next_offset"]) != at:
        raise ValueError(f"its state is at offset {state['next_offset']}")
    records: list[tuple[int, Record]] = [(0, ClusterCreated(state["cluster_id"], state["node_id"]))]
    for b in sorted(state["brokers"], key=lambda b: b["epoch"]):
        registration = BrokerRegistered(
            b["broker_id"], b["incarnation_id"], b["epoch"], b["rack"], tuple(b["listeners"])
        )
        records.append((b["epoch"], registration))
    # The leases, the high-water mark, the reservation.
    leases = state.get("leases", [])
    records += [(at, ProducerIdsLeased(first, end, "snapshot")) for first, end in leases]
    if state.get("lease_mode", False):
        held = max([0] + [end for _, end in leases])
        records.append((at, LeasesState(True, state.get("highest_lease_end", held))))
    records.append((at, ProducerIdsState(state["next_producer_id"], state["blocks_granted"])))
    if state.get("reserved_producer_id", 0):
        records.append((at, ProducerIdsReserved(state["reserved_producer_id"])))
    # The transactional ids: packed (PIDSNAP2), or a list (PIDSNAP1).
    packed = state.get("transactional_ids_packed")
    if packed is None:
        table = TransactionalIdTable()
        for row in state.get("transactional_ids", []):
            table[row[0]] = TransactionalIdState(*row[1:])
        records += [
            (at, _transactional_ids(count, rows)) for count, rows in table.packed_chunks(_WHOLE)
        ]
    elif state["transactional_id_count"]:
        records.append((at, _transactional_ids(state["transactional_id_count"], packed)))
    rotate = state.get("transactional_ids_rotate_at_or_before_ms", -1)
    if rotate >= 0:
        records.append((at, TransactionsState(rotate)))
    # The job allocations: packed with their owners, or (before owners) a list.
    running_ms = last_allocated_ms = 0
    packed = state.get("job_allocations_packed")
    if packed is None:
        jobs = JobTable()
        for app_id, version, allocated_ms, blocks in state.get("job_allocations", []):
            jobs.put_version(app_id, version, allocated_ms, allocated_ms, None, blocks[0])
            for first in blocks[1:]:
                jobs.add_block(app_id, first)
            last_allocated_ms = allocated_ms
            running_ms = max(running_ms, allocated_ms)
        for count, owners, rows in jobs.packed_chunks(_WHOLE):
            records.append((at, JobAllocationsLoaded(count, owners, _base64(rows))))
    elif state["job_app_id_count"]:
        owners = tuple(state["job_owners"])
        records.append(
            (at, JobAllocationsLoaded(state["job_app_id_count"], owners, _base64(packed)))
        )
    jobs_state = JobsState(
        state.get("job_running_ms", running_ms),
        state.get("job_last_allocated_ms", last_allocated_ms),
        state.get("job_damaged_tail_running_ms", -1),
    )
    records.append((at, jobs_state))
    return records


def _transactional_ids(count: int, rows: bytes | bytearray | memoryview) -> TransactionalIdsLoaded:
    return TransactionalIdsLoaded(count, _base64(rows))


def _base64(data: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(data).decode("ascii")
