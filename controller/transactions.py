"""InitProducerId for transactional ids: Kafka's TransactionCoordinator rules, pure.

pidctl keeps no transactions (it hosts no partitions), so a transactional id is always in
Kafka's ``Empty`` state and InitProducerId is only about the producer id and epoch: first
use, re-init (bump, fencing the previous producer), rotation when epochs run out, and the
KIP-360 retry and fencing rules when the client sends its current (producer id, epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from .records import TransactionalIdUpdated
from .state import TransactionalIdState

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Kafka's TransactionMetadata.isEpochExhausted: epoch >= Short.MaxValue - 1. The last value
#: (32767) stays free so that the coordinator can always fence.
EPOCH_EXHAUSTED = 32766
#: Kafka's ``transaction.max.timeout.ms`` default.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
#: Kafka's ``transactional.id.expiration.ms`` default: 7 days.
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    record: TransactionalIdUpdated | None = None


def parse_expected(producer_id: int, producer_epoch: int) -> tuple[int, int] | ErrorCode | None:
    """KafkaApis: (-1, -1) means none given; exactly one of them -1 is INVALID_REQUEST."""
    if producer_id == NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH:
        return None
    if producer_id == NO_PRODUCER_ID or producer_epoch == NO_PRODUCER_EPOCH:
        return ErrorCode.invalid_request
    return producer_id, producer_epoch


def init_transactional(
    current: TransactionalIdState | None,
    *,
    transactional_id: str,
    timeout_ms: int,
    expected: tuple[int, int] | None,
    new_producer_id: Callable[[], int | None],
    now_ms: int,
) -> InitResult:
    """Decide an InitProducerId for a (validated) transactional id.

    ``new_producer_id`` takes a PID from the controller's pool, or returns None when it is
    empty (answered with the retriable COORDINATOR_LOAD_IN_PROGRESS).
    """
    if current is None:
        pid = new_producer_id()
        if pid is None:
            return InitResult(ErrorCode.coordinator_load_in_progress)
        # As Kafka: new metadata starts at epoch -1, so the bump below makes it 0.
        current = TransactionalIdState(
            pid, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, timeout_ms, now_ms
        )

    if expected is not None and not _is_valid_producer_id(current, expected):
        return InitResult(ErrorCode.producer_fenced)

    exhausted = current.producer_epoch >= EPOCH_EXHAUSTED
    if exhausted and (expected is None or expected[1] == current.producer_epoch):
        pid = new_producer_id()
        if pid is None:
            return InitResult(ErrorCode.coordinator_load_in_progress)
        last = current.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        return _transition(transactional_id, current, pid, 0, last, timeout_ms, now_ms)

    bumped = current.producer_epoch + 1
    if expected is None:
        epoch, last = bumped, NO_PRODUCER_EPOCH
    elif current.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == current.producer_epoch:
        # The producer continues after an error and nobody else has initialised since.
        epoch, last = bumped, current.producer_epoch
    elif expected[1] == current.last_producer_epoch:
        # A retry of a bump that already happened: the same answer again. Kafka rewrites the
        # unchanged metadata; pidctl writes nothing, so the previous producer id that makes
        # a retry across a rotation valid is kept for further retries.
        return InitResult(ErrorCode.none, current.producer_id, current.producer_epoch)
    else:
        return InitResult(ErrorCode.producer_fenced)
    return _transition(
        transactional_id, current, current.producer_id, epoch, last, timeout_ms, now_ms
    )


def _is_valid_producer_id(current: TransactionalIdState, expected: tuple[int, int]) -> bool:
    pid, epoch = expected
    return (
        current.producer_epoch == NO_PRODUCER_EPOCH  # just created: a recovering producer
        or pid == current.producer_id
        or (pid == current.previous_producer_id and epoch >= EPOCH_EXHAUSTED)
    )


def _transition(
    transactional_id: str,
    current: TransactionalIdState,
    producer_id: int,
    epoch: int,
    last_epoch: int,
    timeout_ms: int,
    now_ms: int,
) -> InitResult:
    record = TransactionalIdUpdated(
        transactional_id,
        producer_id,
        epoch,
        # As Kafka's TxnTransitMetadata: the previous id is the one held before this change.
        current.producer_id,
        last_epoch,
        timeout_ms,
        now_ms,
    )
    return InitResult(ErrorCode.none, producer_id, epoch, record)


def expired(
    transactional_ids: dict[str, TransactionalIdState], now_ms: int, expiration_ms: int
) -> list[tuple[str, int]]:
    """(transactional id, producer id) of every id unused for longer than ``expiration_ms``."""
    return [
        (tid, state.producer_id)
        for tid, state in transactional_ids.items()
        if now_ms - state.updated_ms > expiration_ms
    ]
