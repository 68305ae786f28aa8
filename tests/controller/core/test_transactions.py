"""TransactionControlManager: Kafka's TransactionCoordinator.handleInitProducerId rules, and
the controller's own pool (KIP-730's broker side) refilled by grants in the same result."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import EPOCH_EXHAUSTED, INT64_MAX
from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.records import (
    ProducerIdsGranted,
    ProducerIdsReserved,
    Record,
    TransactionalIdExpired,
    TransactionalIdUpdated,
)
from pidctl.controller.core.reservations import DEFAULT_RESERVATION_SIZE
from pidctl.controller.core.state import ControllerState
from pidctl.controller.core.transactions import (
    MAX_UPDATED_MS,
    ProducerIdAndEpoch,
    TransactionalIdState,
    TransactionalIdTable,
    parse_expected,
)
from tests.controller.core.kraft import apply, new_state, replay
from tests.controller.core.snapshots import through_snapshot

OK = ErrorCode.none


def _state(pid_range: ProducerIdRange | None = None) -> ControllerState:
    return new_state(pid_range=pid_range)


def init(
    state: ControllerState, expected: tuple[int, int] | None = None, now_ms: int = 123
) -> ProducerIdAndEpoch:
    result = state.transactions.init_transactional(
        "tx", timeout_ms=60_000, expected=expected, now_ms=now_ms
    )
    return apply(state, result)


def held(state: ControllerState) -> TransactionalIdState:
    return state.transactions.transactional_ids["tx"]


def with_id(
    pid: int, epoch: int, last_epoch: int = -1, previous: int | None = None
) -> ControllerState:
    """A state where "tx" holds (pid, epoch), and pid was granted."""
    state = _state()
    replay(
        state,
        ProducerIdsGranted(1, -1, 0, pid + 1, holder="controller"),
        TransactionalIdUpdated(
            "tx", pid, epoch, pid if previous is None else previous, last_epoch, 60_000, 0
        ),
    )
    return state


def test_first_use_grants_the_pool_a_block_and_takes_its_first_pid() -> None:
    state = _state()
    result = state.transactions.init_transactional("tx", timeout_ms=60_000, expected=None, now_ms=5)
    assert result.response == ProducerIdAndEpoch(OK, 0, 0)
    reservation, grant, update = result.records
    assert reservation == ProducerIdsReserved(1000 + DEFAULT_RESERVATION_SIZE)
    assert grant == ProducerIdsGranted(1, -1, 0, 1000, holder="controller")
    assert update == TransactionalIdUpdated("tx", 0, 0, 0, -1, 60_000, 5)
    apply(state, result)
    assert held(state).producer_id == 0


def test_reinit_bumps_the_epoch_of_the_same_pid() -> None:
    state = _state()
    init(state)
    assert init(state) == ProducerIdAndEpoch(OK, 0, 1)
    assert held(state).last_producer_epoch == -1  # a fresh init clears the last epoch


def test_epoch_exhaustion_rotates_to_a_new_pid() -> None:
    state = with_id(7, EPOCH_EXHAUSTED - 1)
    assert init(state).producer_epoch == EPOCH_EXHAUSTED  # 32766 is still handed out
    rotated = init(state)
    assert rotated.producer_epoch == 0 and rotated.producer_id != 7
    assert held(state).previous_producer_id == 7


def test_kip360_bump_with_current_pid_and_epoch() -> None:
    state = _state()
    init(state)
    init(state)  # epoch 1
    bumped = init(state, expected=(0, 1))
    assert bumped == ProducerIdAndEpoch(OK, 0, 2)
    assert held(state).last_producer_epoch == 1


def test_kip360_retry_of_a_bump_returns_the_same_result_and_writes_nothing() -> None:
    state = _state()
    init(state)
    init(state, expected=(0, 0))
    retry = state.transactions.init_transactional(
        "tx", timeout_ms=60_000, expected=(0, 0), now_ms=1
    )
    assert retry.response == ProducerIdAndEpoch(OK, 0, 1)
    assert retry.records == ()


def test_kip360_stale_epoch_is_fenced() -> None:
    state = with_id(7, 2)
    assert init(state, expected=(7, 0)).error == ErrorCode.producer_fenced
    assert init(state, expected=(6, 2)).error == ErrorCode.producer_fenced
    assert held(state).producer_epoch == 2


def test_kip360_rotation_and_its_retry() -> None:
    state = with_id(7, EPOCH_EXHAUSTED)
    rotated = init(state, expected=(7, EPOCH_EXHAUSTED))
    assert rotated.producer_epoch == 0 and rotated.producer_id != 7
    after = held(state)
    assert after.last_producer_epoch == EPOCH_EXHAUSTED and after.previous_producer_id == 7
    assert init(state, expected=(7, EPOCH_EXHAUSTED)) == rotated


def test_recovering_producer_for_an_unknown_id_gets_a_new_pid() -> None:
    assert init(_state(), expected=(42, 3)) == ProducerIdAndEpoch(OK, 0, 0)


def test_invalid_name_and_timeouts() -> None:
    transactions = _state().transactions
    empty = transactions.init_transactional("", timeout_ms=1, expected=None, now_ms=0)
    assert empty.response.error == ErrorCode.invalid_request and empty.records == ()
    for timeout in (0, -1, 900_001):
        result = transactions.init_transactional("t", timeout_ms=timeout, expected=None, now_ms=0)
        assert result.response.error == ErrorCode.invalid_transaction_timeout


def test_idempotent_pids_come_from_blocks_refilled_at_ninety_percent() -> None:
    state = _state()
    transactions = state.transactions
    first = transactions.init_idempotent()
    assert first.response == ProducerIdAndEpoch(OK, 0, 0)
    assert first.records == (
        ProducerIdsReserved(1000 + DEFAULT_RESERVATION_SIZE),
        ProducerIdsGranted(1, -1, 0, 1000, holder="controller"),
    )
    apply(state, first)
    refills: list[Record] = []
    for expected in range(1, 1500):
        result = transactions.init_idempotent()
        assert result.response.producer_id == expected
        refills += result.records
        apply(state, result)
    # The next block was granted once 900 of the first were used, before they ran out.
    assert refills == [ProducerIdsGranted(1, -1, 1000, 2000, holder="controller")]


def test_no_pid_ready_is_coordinator_load_in_progress() -> None:
    state = _state(ProducerIdRange(first=0, last=999))
    for _ in range(1000):
        assert apply(state, state.transactions.init_idempotent()).error == OK
    assert apply(state, state.transactions.init_idempotent()) == ProducerIdAndEpoch(
        ErrorCode.coordinator_load_in_progress
    )
    assert init(state).error == ErrorCode.coordinator_load_in_progress


def test_parse_expected() -> None:
    assert parse_expected(-1, -1) is None
    assert parse_expected(5, 1) == (5, 1)
    assert parse_expected(-1, 1) == ErrorCode.invalid_request
    assert parse_expected(5, -1) == ErrorCode.invalid_request


def test_expiry_selects_ids_unused_for_too_long() -> None:
    state = _state().configure(transactional_id_expiration_ms=500)
    replay(
        state,
        ProducerIdsGranted(1, -1, 0, 3, holder="controller"),
        TransactionalIdUpdated("old", 1, 0, 1, -1, 60_000, 0),
        TransactionalIdUpdated("new", 2, 0, 2, -1, 60_000, 900),
    )
    result = state.transactions.expire(now_ms=1000)
    assert result.records == (TransactionalIdExpired("old", 1),)
    assert apply(state, result) == 1
    assert list(state.transactions.transactional_ids) == ["new"]


def test_ids_are_kept_in_the_order_of_their_last_update() -> None:
    table = TransactionalIdTable()
    for tid, updated in (("a", 10), ("b", 20), ("c", 30)):
        table[tid] = TransactionalIdState(1, 0, -1, -1, 1, updated)
    table["a"] = TransactionalIdState(1, 1, 1, -1, 1, 40)  # a re-init moves it to the end
    assert list(table) == ["b", "c", "a"] and table.latest_updated_ms() == 40
    assert table.oldest(before_ms=35, limit=10) == [("b", 1), ("c", 1)]
    assert table.oldest(before_ms=35, limit=1) == [("b", 1)]
    assert table.oldest(before_ms=20, limit=10) == []  # "b" itself is not before 20
    assert TransactionalIdTable().latest_updated_ms() == 0


def test_expiry_costs_what_expires_in_steps_of_the_limit() -> None:
    state = _state().configure(transactional_id_expiration_ms=500)
    ids = [f"t{i}" for i in range(10)]
    replay(
        state,
        ProducerIdsGranted(1, -1, 0, 10, holder="controller"),
        *(TransactionalIdUpdated(tid, i, 0, i, -1, 60_000, 100 * i) for i, tid in enumerate(ids)),
    )
    # Unused past 500 ms at 1000: updated before 500, t0..t4; in steps of two.
    steps = []
    while True:
        result = state.transactions.expire(now_ms=1000, limit=2)
        steps.append(
            [r.transactional_id for r in result.records if isinstance(r, TransactionalIdExpired)]
        )
        if apply(state, result) < 2:
            break
    assert steps == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert list(state.transactions.transactional_ids) == ids[5:]


def test_a_wall_clock_set_back_dates_updates_at_the_last_one() -> None:
    state = _state()
    for tid, now_ms in (("a", 5_000), ("b", 1_000), ("c", -86_400_000)):  # c: before 1970
        result = state.transactions.init_transactional(
            tid, timeout_ms=60_000, expected=None, now_ms=now_ms
        )
        assert apply(state, result).error == OK
    table = state.transactions.transactional_ids
    assert [table[tid].updated_ms for tid in "abc"] == [5_000, 5_000, 5_000]


def test_a_wall_clock_before_1970_on_a_first_init_dates_it_at_0() -> None:
    state = _state()
    result = state.transactions.init_transactional(
        "tx", timeout_ms=60_000, expected=None, now_ms=-1
    )
    assert apply(state, result) == ProducerIdAndEpoch(OK, 0, 0)
    assert state.transactions.transactional_ids["tx"].updated_ms == 0


def test_states_round_trip_packed_including_the_extremes() -> None:
    table = TransactionalIdTable()
    states = {
        "a": TransactionalIdState(0, 0, 0, -1, 1, 0),
        "b": TransactionalIdState(
            INT64_MAX - 1, EPOCH_EXHAUSTED, INT64_MAX - 2, 32766, 2**31 - 1, MAX_UPDATED_MS - 1
        ),
        "c": TransactionalIdState(7, -1, -1, -1, 900_000, 1_763_870_000_000),
    }
    for tid, state in states.items():
        table[tid] = state
    assert dict(table.items()) == states
    assert table.get("b") == states["b"] and table["c"] == states["c"]
    assert table.get("missing") is None and "a" in table and len(table) == 3


def test_a_state_wider_than_its_row_is_refused_and_corrupts_a_replay() -> None:
    table = TransactionalIdTable()
    with pytest.raises(ValueError, match="updated_ms"):
        table["x"] = TransactionalIdState(1, 0, 1, -1, 60_000, MAX_UPDATED_MS)
    with pytest.raises(ValueError, match="'y'"):
        table["y"] = TransactionalIdState(1, 0, 1, -1, 2**31, 5)  # timeout: 32 bits
    assert len(table) == 0
    state = _state()
    with pytest.raises(InvariantViolation, match="updated_ms"):
        replay(
            state,
            ProducerIdsGranted(1, -1, 0, 3, holder="controller"),
            TransactionalIdUpdated("x", 1, 0, 1, -1, 60_000, -1),
        )
    assert len(state.transactions.transactional_ids) == 0


def test_copies_are_independent_and_compare_by_content() -> None:
    table = TransactionalIdTable()
    table["x"] = TransactionalIdState(1, 0, 1, -1, 60_000, 5)
    copy = table.copy()
    assert copy == table
    del table["x"]
    assert "x" in copy and copy != table


# -- after a damaged tail -------------------------------------------------------------------


def _after_damaged_tail(pid: int, epoch: int, last_epoch: int = -1) -> ControllerState:
    """ "tx" holds (pid, epoch) in the log, and start-up then cut a damaged tail: its newest
    update (to epoch + 1, say) may have been lost."""
    state = with_id(pid, epoch, last_epoch)
    apply(state, state.damaged_tail(100, 0, 0))
    return state


@pytest.mark.parametrize("expected", [None, (7, 3), (7, 4), (7, 9)])
def test_an_id_whose_update_may_be_lost_moves_to_a_new_pid(
    expected: tuple[int, int] | None,
) -> None:
    """Its next epoch (7, 4) may already have been handed out in the lost record: the next
    InitProducerId gets a new producer id instead (never the same pair twice), whether the
    producer presents the epoch in the log, the lost one or none."""
    state = _after_damaged_tail(7, 3)
    answer = init(state, expected)
    assert answer.error == OK and answer.producer_id != 7 and answer.producer_epoch == 0
    assert held(state).previous_producer_id == 7
    # Moved once: it is bumped as usual afterwards.
    assert init(state, (answer.producer_id, 0)) == ProducerIdAndEpoch(OK, answer.producer_id, 1)


def test_a_stale_producer_after_a_damaged_tail_is_still_fenced() -> None:
    state = _after_damaged_tail(7, 3, last_epoch=2)
    assert init(state, (7, 1)).error == ErrorCode.producer_fenced
    # A retry of the bump to 3 is moved as well (its answer may have been bumped since).
    assert init(state, (7, 2)).producer_id != 7


def test_ids_updated_after_the_damaged_tail_are_not_moved() -> None:
    state = _after_damaged_tail(7, 3)
    init(state, now_ms=0)  # moved, and dated after the damage although the clock says 0
    moved = held(state)
    assert moved.updated_ms > state.transactions.rotate_updated_at_or_before_ms
    assert init(state, now_ms=0) == ProducerIdAndEpoch(OK, moved.producer_id, 1)
    # In snapshots too.
    restored = through_snapshot(state)
    assert restored.transactions.rotate_updated_at_or_before_ms == (
        state.transactions.rotate_updated_at_or_before_ms
    )
