"""Committed job versions (controller/core/job_commits.py), decided and replayed: a completed
version, or an older one, is answered "written already"; a commit is its owner's; the commits
survive snapshots and go with their app id when it expires."""

from __future__ import annotations

import base64

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_commits import (
    CommitKey,
    CommitTable,
    parse_commit_key,
    unpack_commits,
)
from pidctl.controller.core.jobs import JobKey, parse_job_key
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.controller.core.producer_ids import Block
from pidctl.controller.core.records import (
    SNAPSHOT_CHUNK_BYTES,
    JobCommitsLoaded,
    JobVersionCommitted,
    ProducerIdsLeased,
)
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state, replay
from tests.controller.core.snapshots import through_snapshot

DAY = 86_400_000
OWNER = "User:j"
OTHER = "User:intruder"


def _state() -> ControllerState:
    return new_state().configure(job_allocation_reuse_ms=DAY, job_allocation_expiration_ms=7 * DAY)


def _block(state: ControllerState, app: str, version: int, block: int = 0) -> Block:
    key = JobKey(app, version, block)
    result = state.jobs.allocate(
        key, wall_ms=0, mono_ms=0, principal=OWNER, client_id=key.client_id()
    )
    return apply(state, result)


def _commit(state: ControllerState, app: str, version: int, principal: str = OWNER) -> ErrorCode:
    return apply(state, state.commits.commit(CommitKey(app, version), principal=principal)).error


def test_the_commit_travels_in_the_client_id() -> None:
    key = CommitKey("nightly/orders", 20261123)
    assert key.client_id() == "pidctl-job/20261123/commit/nightly/orders"
    assert parse_commit_key(key.client_id()) == key
    # A block request is not a commit, and a commit is not a block request.
    assert parse_commit_key(JobKey("a", 1, 0).client_id()) is None
    assert parse_commit_key("local-1700000000") is None
    with pytest.raises(ValueError):
        parse_job_key(key.client_id())


@pytest.mark.parametrize(
    "client_id", ["pidctl-job/1/commit/", "pidctl-job/x/commit/a", "pidctl-job/1/commit/\ufffd"]
)
def test_a_malformed_commit_is_refused(client_id: str) -> None:
    with pytest.raises(ValueError):
        parse_commit_key(client_id)


def test_a_committed_version_is_answered_written_already_with_its_blocks() -> None:
    state = _state()
    first = _block(state, "app", 7).first
    second = _block(state, "app", 7, 1).first
    assert _commit(state, "app", 7) == ErrorCode.none
    assert state.commits.committed_block("app", 7, 0) == Block(
        ErrorCode.duplicate_sequence_number, first, BLOCK_SIZE
    )
    held = state.commits.committed_block("app", 7, 1)
    assert held is not None and held.first == second
    # A block it never held, and an older version: written already, no block named.
    assert state.commits.committed_block("app", 7, 2) == Block(ErrorCode.duplicate_sequence_number)
    assert state.commits.committed_block("app", 6, 0) == Block(ErrorCode.duplicate_sequence_number)
    # A newer version is not covered.
    assert state.commits.committed_block("app", 8, 0) is None


def test_a_commit_again_is_answered_and_writes_nothing() -> None:
    state = _state()
    _block(state, "app", 7)
    assert _commit(state, "app", 7) == ErrorCode.none
    again = state.commits.commit(CommitKey("app", 7), principal=OWNER)
    assert again.records == () and again.response.error == ErrorCode.none
    older = state.commits.commit(CommitKey("app", 3), principal=OWNER)
    assert older.records == () and older.response.error == ErrorCode.none


def test_an_older_version_after_a_later_one_started_is_fenced_unless_committed() -> None:
    state = _state()
    _block(state, "app", 7)
    _block(state, "app", 8)  # version 8 started; 7 never completed
    assert _commit(state, "app", 7) == ErrorCode.producer_fenced
    assert state.commits.committed_block("app", 7, 0) is None
    assert _commit(state, "app", 8) == ErrorCode.none
    assert state.commits.committed_block("app", 7, 0) == Block(ErrorCode.duplicate_sequence_number)


def test_a_version_without_blocks_cannot_be_committed() -> None:
    state = _state()
    assert _commit(state, "never", 1) == ErrorCode.unknown_producer_id
    _block(state, "app", 1)
    assert _commit(state, "app", 2) == ErrorCode.unknown_producer_id
    assert len(state.commits.committed) == 0


def test_only_the_owner_commits() -> None:
    state = _state()
    _block(state, "app", 1)
    assert _commit(state, "app", 1, OTHER) == ErrorCode.transactional_id_authorization_failed
    assert state.commits.committed.get("app") is None


def test_a_fleet_controller_records_no_commit() -> None:
    state = _state()
    replay(state, ProducerIdsLeased(0, 10_000, "etcd"))
    assert _commit(state, "app", 1) == ErrorCode.invalid_request


def test_an_expired_app_id_forgets_its_commit() -> None:
    state = _state()
    _block(state, "app", 1)
    _commit(state, "app", 1)
    apply(state, state.jobs.expire(9 * DAY, 9 * DAY))
    assert state.commits.committed.get("app") is None
    assert state.commits.committed_block("app", 1, 0) is None


def test_replay_refuses_a_commit_of_another_version() -> None:
    state = _state()
    _block(state, "app", 2)
    with pytest.raises(InvariantViolation):
        replay(state, JobVersionCommitted("app", 1))
    with pytest.raises(InvariantViolation):
        replay(state, JobVersionCommitted("unknown", 1))
    replay(state, JobVersionCommitted("app", 2))
    with pytest.raises(InvariantViolation):
        replay(state, JobVersionCommitted("app", 2))


def test_snapshots_keep_the_commits_and_a_copy_shares_them() -> None:
    state = _state()
    for app in ("a", "b", "ü/x"):
        _block(state, app, 3)
        _commit(state, app, 3)
    # A later version started after its commit: the snapshot keeps the older commit.
    _block(state, "a", 4)
    copied = state.copy()
    restored = through_snapshot(state)
    assert restored.commits.committed == state.commits.committed
    assert restored.commits.committed.get("a") == 3
    assert restored == state
    committed = restored.commits.committed_block("b", 3, 0)
    assert committed is not None and committed.error == ErrorCode.duplicate_sequence_number
    # The copy does not see a later commit.
    _block(state, "c", 1)
    _commit(state, "c", 1)
    assert copied.commits.committed.get("c") is None
    assert state.commits.committed.get("c") == 1


def test_many_commits_are_restated_in_chunks() -> None:
    table = CommitTable()
    for n in range(300):
        table.put(f"app-{n}", n)
    chunks = list(table.packed_chunks(1000))
    assert len(chunks) > 1 and all(len(rows) <= 1000 for _, rows in chunks)
    entries = [entry for _, rows in chunks for entry in unpack_commits(rows)]
    assert sum(count for count, _ in chunks) == len(entries) == 300
    assert sorted(entries) == sorted(table.items())


def _loaded(table: CommitTable) -> JobCommitsLoaded:
    ((count, rows),) = table.packed_chunks(SNAPSHOT_CHUNK_BYTES)
    return JobCommitsLoaded(count, base64.b64encode(rows).decode("ascii"))


def test_a_damaged_snapshot_of_commits_is_refused() -> None:
    """A chunk that is cut short, miscounted, not base64, or commits a version pidctl does
    not hold stops the replay (as every snapshot record's check)."""
    state = _state()
    _block(state, "app", 5)
    table = CommitTable()
    table.put("app", 5)
    good = _loaded(table)
    cut = base64.b64encode(base64.b64decode(good.rows)[:-3]).decode("ascii")
    later = CommitTable()
    later.put("app", 6)
    unknown = CommitTable()
    unknown.put("other", 1)
    for damaged in (
        JobCommitsLoaded(1, cut),
        JobCommitsLoaded(2, good.rows),
        JobCommitsLoaded(1, "not base64!"),
        _loaded(later),
        _loaded(unknown),
    ):
        with pytest.raises(InvariantViolation):
            state.copy().commits.replay(9, damaged)
    state.commits.replay(9, good)
    assert state.commits.committed.get("app") == 5
    with pytest.raises(InvariantViolation):  # twice
        state.commits.replay(9, good)


def test_the_log_refuses_a_snapshot_record_of_commits() -> None:
    state = _state()
    _block(state, "app", 5)
    table = CommitTable()
    table.put("app", 5)
    with pytest.raises(InvariantViolation, match="snapshot"):
        replay(state, _loaded(table))
