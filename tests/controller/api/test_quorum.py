"""The quorum controller: a result's records replayed and appended in order, or none of
them; what it answers with; snapshots taken at an instant. Against an in-memory log."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.logformat import MAX_RECORD_BYTES, RecordTooLarge, scan_segment
from pidctl.controller.core.records import (
    SNAPSHOT_RECORDS,
    ClusterCreated,
    ProducerIdsGranted,
    Record,
    TransactionalIdUpdated,
)
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState

NOW = Now(5_000, 7)


class MemoryLog:
    """The log's buffer without the disk: each entry decoded back, in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, Record]] = []

    def append_entry(self, entry: bytes) -> int:
        (decoded,) = scan_segment(entry, len(self.entries)).entries
        self.entries.append((decoded.offset, decoded.record))
        return decoded.offset


def _quorum(
    *observers: Callable[[int, Record], None],
) -> tuple[QuorumController, MemoryLog]:
    """A quorum controller over a log in memory, with records up to offset 1 (the
    ``observers`` see them too)."""
    log = MemoryLog()
    quorum = QuorumController(ControllerState(), log, observers)
    quorum.apply(quorum.state.cluster.create_cluster("c", 1), NOW)
    # Producer ids 0-999, for the transactional ids below (a record may use only those).
    quorum.apply(ControllerResult((ProducerIdsGranted(1, -1, 0, 1000, holder="test"),), None), NOW)
    return quorum, log


def _updated(transactional_id: str, producer_id: int) -> TransactionalIdUpdated:
    return TransactionalIdUpdated(transactional_id, producer_id, 0, -1, -1, 60_000, 5_000)


def test_records_are_replayed_appended_and_observed_in_order() -> None:
    seen: list[tuple[int, Record]] = []
    quorum, log = _quorum(lambda offset, record: seen.append((offset, record)))
    del seen[:2]  # the records up to offset 1
    records = (_updated("a", 1), _updated("b", 2))
    response, offset = quorum.apply(ControllerResult(records, "answer"), NOW)
    assert (response, offset) == ("answer", 3)
    assert log.entries[2:] == seen == [(2, records[0]), (3, records[1])]
    assert set(quorum.state.transactions.transactional_ids) == {"a", "b"}
    assert quorum.state.next_offset == 4


def test_a_result_without_records_waits_for_everything_decided_before() -> None:
    """A response may report what an earlier, still pending record made."""
    quorum, log = _quorum()
    quorum.apply(ControllerResult((_updated("a", 1),), None), NOW)
    assert quorum.apply(ControllerResult((), "cached"), NOW) == ("cached", 2)
    assert len(log.entries) == 3


def test_a_record_too_large_to_read_back_changes_nothing() -> None:
    seen: list[int] = []
    quorum, log = _quorum(lambda offset, record: seen.append(offset))
    transactions = quorum.state.transactions
    quorum.apply(transactions.init_idempotent(), NOW)  # the pool gets a block
    assert transactions.pool.remaining > 0
    before, written = quorum.state.copy(), list(log.entries)
    seen.clear()
    records = (_updated("fits", 5), _updated("x" * (MAX_RECORD_BYTES + 1), 6))
    with pytest.raises(RecordTooLarge):
        quorum.apply(ControllerResult(records, None), NOW)
    assert (log.entries, seen) == (written, [])
    assert "fits" not in transactions.transactional_ids
    assert quorum.state.next_offset == before.next_offset
    # The pool may have been filled by a grant of the refused result: dropped, never reused.
    assert transactions.pool.remaining == 0


def test_a_snapshot_is_of_the_instant_it_was_asked_for() -> None:
    quorum, _ = _quorum()
    build = quorum.snapshot()
    quorum.apply(ControllerResult((_updated("later", 9),), None), NOW)
    records = list(build())
    # The managers' state stands at the instant's offset, the cluster's records where
    # they were written.
    assert {at for at, record in records if type(record) in SNAPSHOT_RECORDS} == {2}
    assert records[0] == (0, ClusterCreated("c", 1))
    taken = ControllerState.from_snapshot_records(2, records)
    assert taken.cluster_id == "c"
    assert "later" not in taken.transactions.transactional_ids
    assert "later" in quorum.state.transactions.transactional_ids
