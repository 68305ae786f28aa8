from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.producer_ids import Block, ProducerIdRange
from pidctl.controller.core.records import ProducerIdFloorRaised, ProducerIdsGranted
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state, replay


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
    assert result.records == (ProducerIdsGranted(7, 1, 0, 1000, "User:b", None, "broker"),)
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
