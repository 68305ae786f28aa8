"""Two-level allocation: leases in the state, blocks granted only inside them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.pid_leases import Lease, ProducerIdSpaceExhausted
from pidctl.controller.core.producer_ids import Block, ProducerIdRange
from pidctl.controller.core.records import (
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsReserved,
)
from pidctl.controller.core.reservations import DEFAULT_RESERVATION_SIZE
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state
from tests.controller.core.snapshots import through_snapshot

#: The range of a controller with ``pid_source``: whatever its leases hold.
LEASED = ProducerIdRange(leased=True)


def _state() -> ControllerState:
    return new_state(pid_range=LEASED, broker=7)


def _lease(state: ControllerState, first: int, end: int) -> None:
    apply(state, state.leases.lease(first, end, "etcd://x/p", 5))


def _grant(state: ControllerState) -> Block:
    return apply(state, state.producer_ids.allocate(broker_id=7, broker_epoch=1))


def lease_remaining(state: ControllerState) -> int:
    return state.leases.remaining()


def wants_lease(state: ControllerState, size: int, ratio: float) -> bool:
    return state.leases.wants_lease(size, ratio)


def lease_bounds(counter: int, state: ControllerState, size: int) -> tuple[int, int]:
    return state.leases.lease_bounds(counter, size)


def test_without_a_lease_nothing_is_granted_and_the_error_is_retriable() -> None:
    state = _state()
    assert _grant(state).error == ErrorCode.request_timed_out  # before the first lease
    assert not state.producer_ids.exhausted()  # waiting for a lease, not used up
    _lease(state, 0, 2000)
    assert [_grant(state).first for _ in range(2)] == [0, 1000]
    refused = state.producer_ids.allocate(broker_id=7, broker_epoch=1)
    assert refused.response.error == ErrorCode.request_timed_out  # retriable, not exhaustion
    assert refused.records == () and refused.response.length == 0


def test_blocks_move_to_the_next_lease_and_skip_a_remainder_smaller_than_a_block() -> None:
    state = _state()
    _lease(state, 500, 2000)  # room for one block, then 500 left over
    _lease(state, 10_000, 12_000)
    firsts = [_grant(state).first for _ in range(3)]
    assert firsts == [500, 10_000, 11_000]
    assert state.leases.leases == []
    assert lease_remaining(state) == 0


def test_remaining_counts_whole_blocks_of_every_lease_held() -> None:
    state = _state()
    _lease(state, 0, 2500)
    _lease(state, 5000, 6000)
    assert lease_remaining(state) == 3000
    _grant(state)
    assert lease_remaining(state) == 2000


def test_prefetch_threshold() -> None:
    state = _state()
    assert wants_lease(state, 10_000, 0.5)  # nothing held
    _lease(state, 0, 10_000)
    assert not wants_lease(state, 10_000, 0.5)
    for _ in range(5):
        _grant(state)
    assert not wants_lease(state, 10_000, 0.5)  # exactly half left
    _grant(state)
    assert wants_lease(state, 10_000, 0.5)


def test_a_lease_starts_above_what_this_controller_granted_or_leased() -> None:
    state = _state()
    state.replay(state.next_offset, ProducerIdFloorRaised(7_000, "zookeeper"))
    # The counter says 0 (a fresh etcd): the lease still starts at the local mark.
    assert lease_bounds(0, state, 1000) == (7_000, 8_000)
    _lease(state, 7_000, 8_000)
    assert state.leases.high_water() == 8_000
    assert lease_bounds(3_000, state, 1000) == (8_000, 9_000)
    assert lease_bounds(50_000, state, 1000) == (50_000, 51_000)
    with pytest.raises(ProducerIdSpaceExhausted):
        lease_bounds(INT64_MAX - 10, state, 1000)


def test_replay_refuses_grants_outside_leases_and_overlapping_leases() -> None:
    state = _state()
    _lease(state, 1000, 3000)
    with pytest.raises(InvariantViolation, match="outside every lease"):
        state.replay(state.next_offset, ProducerIdsGranted(7, 1, 3000, 4000))
    with pytest.raises(InvariantViolation, match="below what is already"):
        _lease(state, 2000, 5000)
    with pytest.raises(InvariantViolation, match="empty or inverted"):
        _lease(state, 9000, 9000)
    with pytest.raises(InvariantViolation, match="lowers"):
        state.replay(state.next_offset, ProducerIdFloorRaised(0, "zookeeper"))
    # Nothing refused changed anything.
    assert state.leases.leases == [Lease(1000, 3000)] and state.next_producer_id == 0


def test_leases_survive_a_snapshot() -> None:
    state = _state()
    _lease(state, 0, 3000)
    _grant(state)
    _lease(state, 8000, 9000)
    again = through_snapshot(state)
    assert again == state
    assert _grant(again).first == 1000


def test_job_grant_needs_no_broker_and_names_the_job() -> None:
    state = _state()
    state.producer_ids.pid_range = ProducerIdRange()
    result = state.producer_ids.allocate_for_job(principal="User:spark", client_id="app-42")
    assert result.response == Block(ErrorCode.none, 0, BLOCK_SIZE)
    assert result.records == (
        ProducerIdsReserved(1000 + DEFAULT_RESERVATION_SIZE),
        ProducerIdsGranted(-1, -1, 0, 1000, "User:spark", "app-42", "job"),
    )


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("lease"), st.integers(0, 5000), st.integers(1, 5)),
            st.tuples(st.just("grant"), st.just(0), st.just(0)),
        ),
        max_size=60,
    )
)
def test_every_grant_lies_in_a_lease_and_none_overlap(ops: list[tuple[str, int, int]]) -> None:
    state = _state()
    leased: list[tuple[int, int]] = []
    granted: list[tuple[int, int]] = []
    for kind, gap, blocks in ops:
        if kind == "lease":
            first, end = lease_bounds(state.leases.high_water() + gap, state, blocks * BLOCK_SIZE)
            _lease(state, first, end)
            leased.append((first, end))
        else:
            block = _grant(state)
            if block.length:
                granted.append((block.first, block.first + block.length))
    for first, end in granted:
        assert any(lf <= first and end <= le for lf, le in leased)
    ordered = sorted(granted)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))
    # Whole leases are used before a later one starts (no PID skipped inside a lease).
    assert lease_remaining(state) + sum(e - f for f, e in granted) == sum(
        (e - f) // BLOCK_SIZE * BLOCK_SIZE for f, e in leased
    )


def test_the_highest_lease_taken_is_remembered_after_its_ids_are_used() -> None:
    """What a counter in etcd must never be seen below again (the lease keeper refuses)."""
    state = _state()
    _lease(state, 0, 2000)
    _lease(state, 5000, 6000)
    for _ in range(3):
        _grant(state)
    assert state.leases.leases == [] and state.leases.highest_lease_end == 6000
    again = through_snapshot(state)
    assert again.leases.highest_lease_end == 6000
