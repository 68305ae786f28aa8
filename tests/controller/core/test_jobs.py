"""Named job versions get their blocks back (controller/core/jobs.py), decided and replayed."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.jobs import JobKey, parse_job_key
from pidctl.controller.core.producer_ids import (
    DEFAULT_RESERVATION_SIZE,
    Block,
    ProducerIdRange,
)
from pidctl.controller.core.records import (
    JobAllocationExpired,
    JobBlockRecorded,
    ProducerIdsGranted,
    ProducerIdsReserved,
)
from pidctl.controller.core.state import ControllerState
from pidctl.protocol.headers import client_id_of
from tests.controller.core.kraft import apply, new_state, replay

DAY = 86_400_000


def _state(first: int = 0) -> ControllerState:
    state = new_state(pid_range=ProducerIdRange(first=first) if first else None)
    return state.configure(job_allocation_reuse_ms=DAY, job_allocation_expiration_ms=7 * DAY)


def _block(state: ControllerState, app: str, version: int, block: int, now_ms: int = 0) -> Block:
    key = JobKey(app, version, block)
    result = state.jobs.allocate(key, now_ms=now_ms, principal="User:j", client_id=key.client_id())
    return apply(state, result)


def test_the_key_travels_in_the_client_id() -> None:
    key = JobKey("nightly/orders", 20261123, 2)
    assert key.client_id() == "pidctl-job/20261123/2/nightly/orders"
    assert parse_job_key(key.client_id()) == key
    assert parse_job_key("local-1700000000") is None
    assert parse_job_key(None) is None


@pytest.mark.parametrize(
    "client_id",
    ["pidctl-job/", "pidctl-job/1/0/", "pidctl-job/x/0/a", "pidctl-job/1/-1/a", "pidctl-job/1/a"],
)
def test_a_malformed_key_is_refused(client_id: str) -> None:
    with pytest.raises(ValueError, match="job key"):
        parse_job_key(client_id)


def test_a_key_read_from_bytes_that_are_not_utf8_is_refused() -> None:
    """Two client ids whose app ids differ only in bytes that are not UTF-8 are read as one
    (each such byte as U+FFFD, as Kafka reads a client id): neither may name a job, or one
    app would be handed the other's blocks."""
    first, second = (client_id_of(b"pidctl-job/1/0/app-" + raw) for raw in (b"\xff", b"\xfe"))
    assert first == second
    with pytest.raises(ValueError, match="not UTF-8"):
        parse_job_key(first)


def test_a_block_index_past_the_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="block below 1000"):
        parse_job_key("pidctl-job/1/1000/app")


def test_first_run_grants_and_records_then_a_rerun_gets_the_same_blocks() -> None:
    state = _state(first=2**62)
    key = JobKey("app", 7, 0)
    result = state.jobs.allocate(key, now_ms=5, principal="User:j", client_id=key.client_id())
    assert result.records == (
        ProducerIdsReserved(2**62 + 1000 + DEFAULT_RESERVATION_SIZE),
        ProducerIdsGranted(-1, -1, 2**62, 2**62 + 1000, "User:j", key.client_id(), "job"),
        JobBlockRecorded("app", 7, 0, 2**62, 5),
    )
    first = apply(state, result)
    second = _block(state, "app", 7, 1, now_ms=6)
    assert (first.first, second.first) == (2**62, 2**62 + 1000)
    # The re-run: the same blocks, nothing written, the high-water mark unchanged.
    again = state.jobs.allocate(key, now_ms=10, principal="User:j", client_id=key.client_id())
    assert again.records == ()
    assert again.response == first
    assert _block(state, "app", 7, 1, now_ms=10) == second
    # A re-run with more partitions: one more block, recorded after the others.
    assert _block(state, "app", 7, 2, now_ms=11).first == 2**62 + 2000
    assert state.jobs.apps["app"].blocks == [2**62, 2**62 + 1000, 2**62 + 2000]


def test_blocks_are_asked_for_in_order() -> None:
    state = _state()
    assert _block(state, "app", 1, 1) == Block(ErrorCode.invalid_request)
    _block(state, "app", 1, 0)
    assert _block(state, "app", 1, 2) == Block(ErrorCode.invalid_request)
    assert state.next_producer_id == 1000


def test_a_newer_version_gets_new_blocks_and_fences_the_older() -> None:
    state = _state()
    old = _block(state, "app", 1, 0)
    new = _block(state, "app", 2, 0)
    assert new.first == old.first + 1000
    assert _block(state, "app", 1, 0) == Block(ErrorCode.producer_fenced)
    assert _block(state, "other", 1, 0).first == new.first + 1000  # app ids are separate


def test_a_rerun_after_the_reuse_window_is_refused() -> None:
    """The brokers may have forgotten the PIDs' sequences: a re-run could write twice."""
    state = _state()
    _block(state, "app", 1, 0, now_ms=0)
    assert _block(state, "app", 1, 0, now_ms=DAY).error == ErrorCode.none
    assert _block(state, "app", 1, 0, now_ms=DAY + 1) == Block(ErrorCode.unknown_producer_id)
    assert _block(state, "app", 2, 0, now_ms=DAY + 1).error == ErrorCode.none


def test_expiry_forgets_app_ids_oldest_first_in_steps() -> None:
    state = _state()
    for index in range(3):
        _block(state, f"app-{index}", 1, 0, now_ms=index * DAY)
    result = state.jobs.expire(7 * DAY + DAY + 1, limit=1)
    assert result.records == (JobAllocationExpired("app-0", 1),)
    apply(state, result)
    assert apply(state, state.jobs.expire(7 * DAY + DAY + 1, limit=5)) == 1
    assert list(state.jobs.apps) == ["app-2"]
    # Forgotten: the app id starts afresh, at any version.
    assert _block(state, "app-0", 0, 0, now_ms=9 * DAY).error == ErrorCode.none


def test_a_clock_set_back_dates_no_version_before_the_newest() -> None:
    state = _state()
    _block(state, "a", 1, 0, now_ms=5 * DAY)
    _block(state, "b", 1, 0, now_ms=DAY)  # the clock went back
    assert state.jobs.apps["b"].allocated_ms == 5 * DAY
    assert list(state.jobs.apps) == ["a", "b"]  # still in expiry order


def test_a_refused_grant_records_nothing() -> None:
    state = _state(first=2**63 - 1001)
    assert _block(state, "app", 1, 0).error == ErrorCode.none
    result = state.jobs.allocate(JobKey("app", 1, 1), now_ms=0, principal="p", client_id=None)
    assert result.response.error == ErrorCode.unknown_server_error
    assert result.records == ()


@pytest.mark.parametrize(
    "record",
    [
        JobBlockRecorded("app", 1, 2, 5000, 0),  # skips block 1
        JobBlockRecorded("app", 0, 0, 5000, 0),  # older version
        JobBlockRecorded("new", 1, 1, 5000, 0),  # a new version not at block 0
        JobAllocationExpired("app", 2),  # not its latest version
        JobAllocationExpired("nobody", 1),
    ],
)
def test_replay_refuses_records_that_break_the_order(
    record: JobBlockRecorded | JobAllocationExpired,
) -> None:
    state = _state()
    _block(state, "app", 1, 0)
    with pytest.raises(InvariantViolation):
        replay(state, record)


def test_a_snapshot_keeps_the_allocations_in_expiry_order() -> None:
    state = _state()
    _block(state, "b", 3, 0, now_ms=1)
    _block(state, "b", 3, 1, now_ms=2)
    _block(state, "a", 1, 0, now_ms=3)
    restored = ControllerState.from_snapshot(state.to_snapshot())
    assert restored == state
    assert list(restored.jobs.apps) == ["b", "a"]
    assert restored.jobs.apps["b"].blocks == [0, 1000]
