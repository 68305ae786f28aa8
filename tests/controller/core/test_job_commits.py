"""Committed job versions (controller/core/job_commits.py), decided and replayed: a completed
version, or an older one, is answered "written already"; a commit is its owner's; the commits
survive snapshots and go with their app id when it expires."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.job_commits import CommitKey, CommitTable, parse_commit_key
from pidctl.controller.core.jobs import JobKey, parse_job_key
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.controller.core.producer_ids import Block
from pidctl.controller.core.records import JobVersionCommitted, ProducerIdsLeased
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state, replay

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
    copied = state.copy()
    restored = ControllerState.from_snapshot(state.to_snapshot())
    assert restored.commits.committed == state.commits.committed
    assert restored == state
    # The copy does not see a later commit.
    _block(state, "c", 1)
    _commit(state, "c", 1)
    assert copied.commits.committed.get("c") is None
    assert state.commits.committed.get("c") == 1


def test_a_snapshot_from_before_commits_is_read() -> None:
    state = _state()
    _block(state, "a", 1)
    data = state.to_snapshot()
    del data["job_commits_packed"], data["job_commit_count"]
    assert len(ControllerState.from_snapshot(data).commits.committed) == 0


def test_a_damaged_packed_table_is_refused() -> None:
    table = CommitTable()
    table.put("app", 5)
    packed = table.packed()
    assert CommitTable.from_packed(packed, 1) == table
    with pytest.raises(ValueError):
        CommitTable.from_packed(packed[:-3], 1)
    with pytest.raises(ValueError):
        CommitTable.from_packed(packed, 2)
