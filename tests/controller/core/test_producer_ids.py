from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.producer_ids import Block, ProducerIdRange
from pidctl.controller.core.records import (
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
    ProducerIdsReserved,
)
from pidctl.controller.core.reservations import DEFAULT_RESERVATION_SIZE
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state, replay
from tests.controller.core.snapshots import through_snapshot


def _state(next_producer_id: int = 0, pid_range: ProducerIdRange | None = None) -> ControllerState:
    state = new_state(pid_range=pid_range, broker=7)
    if next_producer_id:
        replay(state, ProducerIdFloorRaised(next_producer_id, "test"))
    return state


def _grant(state: ControllerState) -> Block:
    return apply(state, state.producer_ids.allocate(broker_id=7, broker_epoch=1))


def test_blocks_of_1000_from_zero() -> None:
    state = _state()
    blocks = [_grant(state) for _ in range(3)]
    assert [(b.first, b.length) for b in blocks] == [(0, 1000), (1000, 1000), (2000, 1000)]
    assert state.next_producer_id == 3000


def test_the_grant_record_stores_broker_epoch_and_next_pid() -> None:
    state = _state()
    result = state.producer_ids.allocate(broker_id=7, broker_epoch=1, principal="User:b")
    assert result.records == (
        ProducerIdsReserved(1000 + DEFAULT_RESERVATION_SIZE),
        ProducerIdsGranted(7, 1, 0, 1000, "User:b", None, "broker"),
    )
    assert state.next_producer_id == 0  # deciding changes nothing; replaying does


@pytest.mark.parametrize(("broker_id", "epoch"), [(7, 2), (7, -1), (8, 1), (-1, -1)])
def test_stale_or_unknown_broker(broker_id: int, epoch: int) -> None:
    result = _state().producer_ids.allocate(broker_id=broker_id, broker_epoch=epoch)
    assert result.response == Block(ErrorCode.stale_broker_epoch, 0, 0)
    assert result.records == ()


def test_last_block_below_int64_max_then_exhaustion() -> None:
    state = _state(next_producer_id=INT64_MAX - BLOCK_SIZE)
    last = _grant(state)
    assert last.error == ErrorCode.none
    assert last.first + last.length - 1 == INT64_MAX - 1  # 2^63-1 never granted
    exhausted = _grant(state)
    assert exhausted == Block(ErrorCode.unknown_server_error, 0, 0)


def test_kafka_boundary_one_past_the_last_block_is_exhausted() -> None:
    assert _grant(_state(INT64_MAX - BLOCK_SIZE + 1)).error == ErrorCode.unknown_server_error


def test_range_settings_restrict_the_grants() -> None:
    state = _state(pid_range=ProducerIdRange(first=5_000, last=6_999))
    assert _grant(state).first == 5_000
    assert _grant(state).first == 6_000
    assert _grant(state).error == ErrorCode.unknown_server_error
    assert state.producer_ids.remaining() == 0


def test_exhausted_once_no_whole_block_is_left_in_the_range() -> None:
    state = _state(pid_range=ProducerIdRange(first=0, last=1_998))  # one block and 999 over
    assert not state.producer_ids.exhausted()
    _grant(state)
    assert state.producer_ids.exhausted()  # what /readyz and the refusals' label say
    assert _grant(state).error == ErrorCode.unknown_server_error


def test_range_below_the_high_water_mark_never_goes_back() -> None:
    assert _grant(_state(next_producer_id=10_000)).first == 10_000


def test_replayed_grants_must_strictly_increase() -> None:
    state = _state()
    _grant(state)
    with pytest.raises(Exception, match="below the high-water mark"):
        replay(state, ProducerIdsGranted(7, 1, 0, 1000))
    with pytest.raises(Exception, match="empty or inverted"):
        replay(state, ProducerIdsGranted(7, 1, 2000, 2000))
    assert state.next_producer_id == 1000


@pytest.mark.parametrize(("first", "last"), [(-1, 10), (10, 9), (0, INT64_MAX)])
def test_invalid_ranges(first: int, last: int) -> None:
    with pytest.raises(ValueError):
        ProducerIdRange(first, last)


# -- reservations: start-up grants above whatever the log's tail may have lost ----------------


def _reservations(state: ControllerState, result: object) -> list[int]:
    records = getattr(result, "records", ())
    return [r.next_producer_id for r in records if isinstance(r, ProducerIdsReserved)]


def test_a_grant_past_the_reservation_reserves_first_and_ahead() -> None:
    state = _state().configure(reservation_size=5000)
    first = state.producer_ids.allocate(broker_id=7, broker_epoch=1)
    assert isinstance(first.records[0], ProducerIdsReserved)  # before the grant
    assert _reservations(state, first) == [6000]
    apply(state, first)
    for _ in range(5):  # 1000..6000: inside the reservation
        result = state.producer_ids.allocate(broker_id=7, broker_epoch=1)
        assert _reservations(state, result) == []
        apply(state, result)
    seventh = state.producer_ids.allocate(broker_id=7, broker_epoch=1)
    assert _reservations(state, seventh) == [12_000]
    apply(state, seventh)
    assert state.reservations.reserved == 12_000


def test_the_reservation_stops_at_the_end_of_the_range_or_the_lease() -> None:
    narrow = _state(pid_range=ProducerIdRange(0, 2999)).configure(reservation_size=10_000)
    assert _reservations(narrow, narrow.producer_ids.allocate(broker_id=7, broker_epoch=1)) == [
        3000
    ]
    leased = _state().configure(reservation_size=10_000)
    replay(leased, ProducerIdsLeased(0, 4000, "etcd://x/p"))
    result = leased.producer_ids.allocate(broker_id=7, broker_epoch=1)
    assert _reservations(leased, result) == [4000]


def test_resume_goes_on_above_the_reservation_the_log_or_the_file_holds() -> None:
    state = _state().configure(reservation_size=5000)
    _grant(state)  # reserves 6000 in the log
    assert state.producer_ids.resume(None).response == 6000
    assert state.producer_ids.resume(9000).response == 9000  # the file is ahead of the log
    result = state.producer_ids.resume(6000)
    assert result.records == (
        ProducerIdFloorRaised(
            6000, "start-up: the reservation (the log's tail may have lost grants below it)"
        ),
    )
    apply(state, result)
    assert _grant(state).first == 6000


def test_resume_of_a_log_from_before_reservations_adds_one_margin() -> None:
    state = _state().configure(reservation_size=5000)
    replay(state, ProducerIdsGranted(7, 1, 0, 1000))  # written before reservations
    result = state.producer_ids.resume(None)
    assert result.response == 6000
    apply(state, result)
    assert state.reservations.reserved == 6000
    fresh = _state()
    assert fresh.producer_ids.resume(None).records == ()


def test_a_clean_shutdown_releases_the_reservation_to_the_high_water_mark() -> None:
    state = _state()
    _grant(state)
    apply(state, state.reservations.release())
    assert state.reservations.reserved == 1000
    assert state.producer_ids.resume(1000).records == ()
    assert state.reservations.release().records == ()


def test_replay_refuses_a_grant_past_the_reservation_or_one_below_the_mark() -> None:
    state = _state()
    replay(state, ProducerIdsReserved(2000), ProducerIdsGranted(7, 1, 0, 1000))
    with pytest.raises(InvariantViolation, match="past the reservation 2000"):
        replay(state, ProducerIdsGranted(7, 1, 1000, 3000))
    with pytest.raises(InvariantViolation, match="below the high-water mark"):
        replay(state, ProducerIdsReserved(500))
    assert through_snapshot(state).reservations.reserved == 2000
