"""Snapshots an older pidctl wrote (PIDSNAP1: JSON; PIDSNAP2: JSON and raw sections) read
as records, and the state they hold restored whole.

The files are written here as those versions wrote them (their field names and layout,
from the formats documented in docs/log-format.md's history), from a state with every kind
of thing a snapshot holds: brokers, a reservation, transactional ids of every shape, app
ids with owners, the damaged tail's bounds."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from pidctl.controller.core.job_table import JobTable
from pidctl.controller.core.logformat import LogCorruption, snapshot_name
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    DamagedTailTruncated,
    JobBlockRecorded,
    ProducerIdsGranted,
    ProducerIdsReserved,
    Record,
    TransactionalIdUpdated,
)
from pidctl.controller.core.state import ControllerState
from pidctl.controller.core.transactions import state_fields
from pidctl.controller.log.datadir import decode_snapshot, write_reservation_file
from pidctl.controller.log.recovery import read_log, recover
from tests.controller.log.test_metalog import write_segment

ODD_IDS = ["app-1", "ünïcode-✓", "lone-\udcff-surrogate", "x" * 32767, 'with,"quote" and \\']


def _state(owners: bool) -> ControllerState:
    """A state holding one of everything a snapshot restates."""
    records: list[Record] = [
        ClusterCreated("c", 1),
        BrokerRegistered(3, "inc", 1, "rack-a", ("PLAINTEXT://broker:9092",)),
        ProducerIdsReserved(50_000),
        ProducerIdsGranted(3, 1, 0, 1000),
        ProducerIdsGranted(1, -1, 1000, 2000, holder="controller"),
        *(
            TransactionalIdUpdated(tid, 1000 + i, i, -1, -1, 60_000, 5_000 + i)
            for i, tid in enumerate(ODD_IDS)
        ),
    ]
    first = 2000
    for index, app in enumerate(["b", "a", "ç/app"]):
        records.append(ProducerIdsGranted(-1, -1, first, first + 1000, "User:x", None, "job"))
        principal = f"User:{index % 2}" if owners else None
        running = 7_000 + index if owners else None
        records.append(JobBlockRecorded(app, 3, 0, first, 7_000 + index, principal, running))
        first += 1000
    if owners:
        records.append(DamagedTailTruncated(12, 7_500, 5_002))
    state = ControllerState()
    for offset, record in enumerate(records):
        state.replay(offset, record)
    return state


def _common_fields(state: ControllerState) -> dict[str, Any]:
    producer_ids = state.producer_ids
    return {
        "cluster_id": state.cluster.cluster_id,
        "node_id": state.cluster.node_id,
        "brokers": [
            {
                "broker_id": b.broker_id,
                "incarnation_id": b.incarnation_id,
                "epoch": b.epoch,
                "rack": b.rack,
                "listeners": list(b.listeners),
            }
            for b in state.cluster.brokers.values()
        ],
        "next_producer_id": producer_ids.next_producer_id,
        "blocks_granted": producer_ids.blocks_granted,
        "lease_mode": False,
        "leases": [],
        "reserved_producer_id": state.reservations.reserved,
        "next_offset": state.next_offset,
    }


def _write(directory: Path, offset: int, magic: bytes, body: bytes) -> Path:
    header = struct.pack(">8sIQ", magic, zlib.crc32(body), len(body))
    path = directory / snapshot_name(offset)
    path.write_bytes(header + body)
    write_segment(directory, [], base=offset)
    write_reservation_file(directory, 50_000)  # the state's reservation, as the log made it
    return path


def _pidsnap1(directory: Path, state: ControllerState) -> Path:
    """All JSON: transactional ids as lists, app ids (before owners) as lists."""
    fields = _common_fields(state)
    fields["transactional_ids"] = [
        [tid, *state_fields(t)] for tid, t in state.transactions.transactional_ids.items()
    ]
    fields["job_allocations"] = [
        [app_id, held.version, held.allocated_ms, held.blocks]
        for app_id, held in sorted(state.jobs.apps.items(), key=lambda item: item[1].running_ms)
    ]
    body = json.dumps({"offset": state.next_offset, "state": fields}).encode()
    return _write(directory, state.next_offset, b"PIDSNAP1", body)


def _pidsnap2(directory: Path, state: ControllerState) -> Path:
    """JSON, then the packed transactional ids and app ids (with their owners) as raw
    sections."""
    fields = _common_fields(state)
    ((_, packed_ids),) = state.transactions.transactional_ids.packed_chunks(1 << 62)
    ((_, owners, packed_apps),) = state.jobs.apps.packed_chunks(1 << 62)
    fields.update(
        transactional_id_count=len(state.transactions.transactional_ids),
        transactional_ids_rotate_at_or_before_ms=state.transactions.rotate_updated_at_or_before_ms,
        job_app_id_count=len(state.jobs.apps),
        job_owners=list(owners),
        job_running_ms=state.jobs.running_ms,
        job_last_allocated_ms=state.jobs.last_allocated_ms,
        job_damaged_tail_running_ms=state.jobs.damaged_tail_running_ms,
    )
    raw = [("transactional_ids_packed", packed_ids), ("job_allocations_packed", packed_apps)]
    head = json.dumps(
        {
            "offset": state.next_offset,
            "state": fields,
            "raw": [[name, len(value)] for name, value in raw],
        }
    ).encode()
    body = struct.pack(">I", len(head)) + head + b"".join(value for _, value in raw)
    return _write(directory, state.next_offset, b"PIDSNAP2", body)


def test_a_first_format_snapshot_restores_its_state(tmp_path: Path) -> None:
    state = _state(owners=False)
    _pidsnap1(tmp_path, state)
    recovered = recover(tmp_path).state
    assert recovered == state
    held = recovered.jobs.apps.get("b")
    assert held is not None and (held.blocks, held.allocated_ms, held.owner) == (
        [2000],
        7_000,
        None,
    )
    assert recovered.jobs.running_ms == 7_002  # the latest version's time stands in for it
    assert read_log(tmp_path).snapshot_entries  # the tools read it, as records


def test_a_second_format_snapshot_restores_its_state(tmp_path: Path) -> None:
    state = _state(owners=True)
    path = _pidsnap2(tmp_path, state)
    recovered = recover(tmp_path).state
    assert recovered == state
    assert recovered.jobs.apps.held_by("User:0") == 2
    assert recovered.transactions.rotate_updated_at_or_before_ms == 5_002
    assert recovered.jobs.damaged_tail_running_ms == 7_500
    # Read back as the records a snapshot holds now (the one converter).
    _, entries = decode_snapshot(path, path.read_bytes())
    kinds = [type(entry.record).__name__ for entry in entries]
    assert kinds[:2] == ["ClusterCreated", "BrokerRegistered"]
    assert "TransactionalIdsLoaded" in kinds and "JobAllocationsLoaded" in kinds


def test_the_next_snapshot_after_an_old_one_is_records(tmp_path: Path) -> None:
    state = _state(owners=True)
    _pidsnap2(tmp_path, state)
    recovered = recover(tmp_path).state
    assert recovered.copy() == state
    rewritten = ControllerState.from_snapshot_records(
        recovered.next_offset, recovered.snapshot_records()
    )
    assert rewritten == state


def test_an_old_snapshot_that_does_not_parse_is_corruption(tmp_path: Path) -> None:
    state = _state(owners=False)
    path = _pidsnap1(tmp_path, state)
    broken = json.loads(path.read_bytes()[20:])
    del broken["state"]["next_producer_id"]
    _write(tmp_path, state.next_offset, b"PIDSNAP1", json.dumps(broken).encode())
    with pytest.raises(LogCorruption, match="snapshot does not parse"):
        recover(tmp_path)


def test_rows_packed_out_of_running_order_are_loaded_in_it() -> None:
    """A table packed in another order (with other shards, or none) is loaded each shard
    in running order: an expiry reads a shard from its front."""
    table = JobTable()
    for index in range(200):
        table.put_version(f"app-{index}", 1, index, 1_000 - index, None, index * 1000)
    ((count, owners, packed),) = table.packed_chunks(1 << 62)
    loaded = JobTable()
    loaded.load_packed(packed, count, owners)
    assert loaded == table
    for shard in loaded._shards:  # each in running order, as an expiry reads it
        versions = [loaded.get(app_id) for app_id in shard]
        stamps = [version.running_ms for version in versions if version is not None]
        assert stamps == sorted(stamps)
    expired = {app for app, _ in loaded.expired(1_000 - 189, 1000)}
    assert expired == {f"app-{index}" for index in range(190, 200)}
