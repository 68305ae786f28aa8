from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from controller import producer_ids
from controller.producer_ids import BLOCK_SIZE, INT64_MAX, ProducerIdRange
from controller.records import BrokerRegistered, ClusterCreated
from controller.state import ControllerState


def _state(next_producer_id: int = 0) -> ControllerState:
    state = ControllerState()
    state.replay(0, ClusterCreated("c", 1))
    state.replay(1, BrokerRegistered(7, "inc", 1))
    state.next_producer_id = next_producer_id
    return state


def _grant(
    state: ControllerState, pid_range: ProducerIdRange | None = None
) -> producer_ids.Allocation:
    allocation = producer_ids.allocate(
        state, pid_range or ProducerIdRange(), broker_id=7, broker_epoch=1
    )
    if allocation.record is not None:
        state.replay(state.next_offset, allocation.record)
    return allocation


def test_blocks_of_1000_from_zero() -> None:
    state = _state()
    blocks = [_grant(state) for _ in range(3)]
    assert [(b.first_producer_id, b.length) for b in blocks] == [
        (0, 1000),
        (1000, 1000),
        (2000, 1000),
    ]
    assert state.next_producer_id == 3000


@pytest.mark.parametrize(("broker_id", "epoch"), [(7, 2), (7, -1), (8, 1), (-1, -1)])
def test_stale_or_unknown_broker(broker_id: int, epoch: int) -> None:
    allocation = producer_ids.allocate(
        _state(), ProducerIdRange(), broker_id=broker_id, broker_epoch=epoch
    )
    assert allocation.error == ErrorCode.stale_broker_epoch
    assert (allocation.first_producer_id, allocation.length, allocation.record) == (0, 0, None)


def test_last_block_below_int64_max_then_exhaustion() -> None:
    state = _state(next_producer_id=INT64_MAX - BLOCK_SIZE)
    last = _grant(state)
    assert last.error == ErrorCode.none
    assert last.first_producer_id + last.length - 1 == INT64_MAX - 1  # 2^63-1 never granted
    exhausted = _grant(state)
    assert exhausted.error == ErrorCode.unknown_server_error
    assert (exhausted.first_producer_id, exhausted.length) == (0, 0)


def test_kafka_boundary_one_past_the_last_block_is_exhausted() -> None:
    assert _grant(_state(INT64_MAX - BLOCK_SIZE + 1)).error == ErrorCode.unknown_server_error


def test_range_settings_restrict_the_grants() -> None:
    pid_range = ProducerIdRange(first=5_000, last=6_999)
    state = _state()
    assert _grant(state, pid_range).first_producer_id == 5_000
    assert _grant(state, pid_range).first_producer_id == 6_000
    assert _grant(state, pid_range).error == ErrorCode.unknown_server_error
    assert producer_ids.remaining_producer_ids(state, pid_range) == 0


def test_range_below_the_high_water_mark_never_goes_back() -> None:
    state = _state(next_producer_id=10_000)
    assert _grant(state, ProducerIdRange(first=0)).first_producer_id == 10_000


@pytest.mark.parametrize(("first", "last"), [(-1, 10), (10, 9), (0, INT64_MAX)])
def test_invalid_ranges(first: int, last: int) -> None:
    with pytest.raises(ValueError):
        ProducerIdRange(first, last)
