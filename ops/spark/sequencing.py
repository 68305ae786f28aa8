"""Which batches a sink applies: Kafka's producer-sequence rules (ops/broker/sequences.py)
against the state a database keeps per producer id.

A task writes its partition in batches; batch k of partition p carries producer id
``allocation.producer_id(p)``, the job's epoch, and sequences ``k*B .. k*B+len-1`` counted
from the partition's first row. A retried or speculative attempt sends the same batches:
those already applied are duplicates and skipped; anything that would leave a gap is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kio.schema.errors import ErrorCode

from pidctl.broker.sequences import SEQUENCE_LIMIT, ProducerStateTable


class SequenceError(RuntimeError):
    """A batch that must not be applied: a gap in the sequences, or a fenced epoch."""


class Decision(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class StoredProducer:
    """What the database keeps per producer id: epoch, and first and last sequence of the
    last batch applied."""

    epoch: int
    last_batch_first_sequence: int
    last_sequence: int


def decide(
    stored: StoredProducer | None, producer_id: int, epoch: int, first_sequence: int, count: int
) -> Decision:
    """Apply or skip a batch of ``count`` rows, or raise :class:`SequenceError`."""
    # Latest-sequence mode with a window of half the sequence space: everything at or below
    # the last sequence is a duplicate (the database keeps no older batches). A producer
    # the database does not know must start at sequence 0 (Kafka before KIP-360), since a
    # job's producer ids are always fresh.
    table = ProducerStateTable(
        mode="latest",
        duplicate_window=SEQUENCE_LIMIT // 2,
        unknown_producer="reject" if stored is None else "accept",
    )
    if stored is not None:
        table.append(
            producer_id,
            stored.epoch,
            stored.last_batch_first_sequence,
            stored.last_sequence - stored.last_batch_first_sequence + 1,
            0,
            0,
        )
    verdict = table.check(producer_id, epoch, first_sequence, count)
    if verdict.appendable:
        return Decision.APPEND
    if verdict.duplicate or verdict.error == ErrorCode.duplicate_sequence_number:
        return Decision.DUPLICATE
    last = stored.last_sequence if stored is not None else -1
    if verdict.error == ErrorCode.invalid_producer_epoch:
        raise SequenceError(
            f"producer {producer_id}: epoch {epoch} is fenced by epoch {stored and stored.epoch}"
        )
    raise SequenceError(
        f"producer {producer_id} epoch {epoch}: batch at sequence {first_sequence} does not "
        f"follow the last applied sequence {last} ({verdict.error.name}); refusing a gap"
    )
