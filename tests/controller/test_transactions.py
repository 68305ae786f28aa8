"""Kafka's TransactionCoordinator.handleInitProducerId rules for transactional ids."""

from __future__ import annotations

from collections.abc import Iterator

from kio.schema.errors import ErrorCode

from controller import transactions
from controller.state import TransactionalIdState
from controller.transactions import EPOCH_EXHAUSTED, InitResult


class Pids:
    def __init__(self, start: int = 1000) -> None:
        self._next: Iterator[int] = iter(range(start, 10**6))
        self.empty = False

    def __call__(self) -> int | None:
        return None if self.empty else next(self._next)


def init(
    current: TransactionalIdState | None,
    expected: tuple[int, int] | None = None,
    pids: Pids | None = None,
) -> InitResult:
    return transactions.init_transactional(
        current, transactional_id="tx", timeout_ms=60_000, expected=expected,
        new_producer_id=pids or Pids(), now_ms=123,
    )  # fmt: skip


def state(result: InitResult) -> TransactionalIdState:
    r = result.record
    assert r is not None
    return TransactionalIdState(
        r.producer_id, r.producer_epoch, r.previous_producer_id, r.last_producer_epoch,
        r.timeout_ms, r.updated_ms,
    )  # fmt: skip


def test_first_use_gets_a_new_pid_at_epoch_zero() -> None:
    first = init(None)
    assert (first.error, first.producer_id, first.producer_epoch) == (0, 1000, 0)
    assert first.record is not None and first.record.previous_producer_id == 1000


def test_reinit_bumps_the_epoch_of_the_same_pid() -> None:
    s = state(init(None))
    again = init(s)
    assert (again.producer_id, again.producer_epoch) == (1000, 1)
    assert state(again).last_producer_epoch == -1  # a fresh init clears the last epoch


def test_epoch_exhaustion_rotates_to_a_new_pid() -> None:
    s = TransactionalIdState(7, EPOCH_EXHAUSTED - 1, 7, -1, 60_000, 0)
    bumped = init(s)
    assert bumped.producer_epoch == EPOCH_EXHAUSTED  # 32766 is still handed out
    rotated = init(state(bumped), pids=Pids(5000))
    assert (rotated.producer_id, rotated.producer_epoch) == (5000, 0)
    assert state(rotated).previous_producer_id == 7


def test_kip360_bump_with_current_pid_and_epoch() -> None:
    s = state(init(state(init(None))))  # epoch 1
    bumped = init(s, expected=(s.producer_id, s.producer_epoch))
    assert bumped.producer_epoch == s.producer_epoch + 1
    assert state(bumped).last_producer_epoch == s.producer_epoch


def test_kip360_retry_of_a_bump_returns_the_same_result_and_writes_nothing() -> None:
    s = state(init(None))
    bumped = state(init(s, expected=(1000, 0)))
    retry = init(bumped, expected=(1000, 0))
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (0, 1000, 1)
    assert retry.record is None


def test_kip360_stale_epoch_is_fenced() -> None:
    s = state(init(state(init(state(init(None))))))  # epoch 2, last -1
    assert init(s, expected=(1000, 0)).error == ErrorCode.producer_fenced
    assert init(s, expected=(999, 2)).error == ErrorCode.producer_fenced


def test_kip360_rotation_and_its_retry() -> None:
    s = TransactionalIdState(7, EPOCH_EXHAUSTED, 7, -1, 60_000, 0)
    rotated = init(s, expected=(7, EPOCH_EXHAUSTED), pids=Pids(5000))
    assert (rotated.producer_id, rotated.producer_epoch) == (5000, 0)
    after = state(rotated)
    assert after.last_producer_epoch == EPOCH_EXHAUSTED and after.previous_producer_id == 7
    retry = init(after, expected=(7, EPOCH_EXHAUSTED))
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (0, 5000, 0)


def test_recovering_producer_for_an_unknown_id_gets_a_new_pid() -> None:
    result = init(None, expected=(42, 3))
    assert (result.error, result.producer_id, result.producer_epoch) == (0, 1000, 0)


def test_empty_pool_is_coordinator_load_in_progress() -> None:
    pids = Pids()
    pids.empty = True
    assert init(None, pids=pids).error == ErrorCode.coordinator_load_in_progress
    exhausted = TransactionalIdState(7, EPOCH_EXHAUSTED, 7, -1, 60_000, 0)
    assert init(exhausted, pids=pids).error == ErrorCode.coordinator_load_in_progress


def test_parse_expected() -> None:
    assert transactions.parse_expected(-1, -1) is None
    assert transactions.parse_expected(5, 1) == (5, 1)
    assert transactions.parse_expected(-1, 1) == ErrorCode.invalid_request
    assert transactions.parse_expected(5, -1) == ErrorCode.invalid_request


def test_expiry_selects_ids_unused_for_too_long() -> None:
    held = {
        "old": TransactionalIdState(1, 0, 1, -1, 60_000, updated_ms=0),
        "new": TransactionalIdState(2, 0, 2, -1, 60_000, updated_ms=900),
    }
    assert transactions.expired(held, now_ms=1000, expiration_ms=500) == [("old", 1)]
