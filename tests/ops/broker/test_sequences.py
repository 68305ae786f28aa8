"""Producer-sequence rules: Kafka's cases one by one, then hypothesis against a model."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from pidctl.broker.sequences import (
    SEQUENCE_LIMIT,
    CorruptSnapshot,
    ProducerStateTable,
    last_sequence,
)


def test_in_order_duplicate_gap_and_epochs() -> None:
    table = ProducerStateTable()
    assert table.append(7, 0, 0, 5, first_offset=100, now_ms=0).appendable
    duplicate = table.append(7, 0, 0, 5, first_offset=200, now_ms=0)
    assert duplicate.duplicate and (duplicate.first_offset, duplicate.last_offset) == (100, 104)
    assert table.append(7, 0, 10, 1, 200, 0).error == ErrorCode.out_of_order_sequence_number
    assert table.append(7, 0, 5, 3, 200, 0).appendable
    assert table.append(7, 1, 3, 1, 300, 0).error == ErrorCode.out_of_order_sequence_number
    assert table.append(7, 1, 0, 1, 300, 0).appendable  # a bump restarts at 0
    assert table.append(7, 0, 8, 1, 301, 0).error == ErrorCode.invalid_producer_epoch


def test_old_batch_no_longer_retained_is_duplicate_sequence_number() -> None:
    table = ProducerStateTable(batches_to_retain=5)
    for i in range(10):
        table.append(1, 0, i, 1, i, 0)
    assert table.append(1, 0, 2, 1, 99, 0).error == ErrorCode.duplicate_sequence_number
    assert table.append(1, 0, 7, 1, 99, 0).first_offset == 7  # still retained


def test_sequence_wraps_at_int32_max() -> None:
    table = ProducerStateTable()
    start = SEQUENCE_LIMIT - 3
    assert last_sequence(start, 5) == 1
    assert table.append(1, 0, start, 3, 0, 0).appendable  # ends at 2^31 - 1
    assert table.append(1, 0, 0, 2, 3, 0).appendable  # the next one starts over at 0


def test_unknown_producer_policies() -> None:
    assert ProducerStateTable().append(1, 0, 42, 1, 0, 0).appendable  # Kafka >= 2.5
    strict = ProducerStateTable(unknown_producer="reject")
    assert strict.append(1, 0, 42, 1, 0, 0).error == ErrorCode.unknown_producer_id
    assert strict.append(1, 0, 0, 1, 0, 0).appendable


def test_latest_mode_reports_anything_in_the_window_below_as_duplicate() -> None:
    table = ProducerStateTable(mode="latest", duplicate_window=100)
    for i in range(50):
        table.append(1, 0, i * 2, 2, i * 2, 0)
    exact = table.append(1, 0, 98, 2, 500, 0)
    assert exact.duplicate and exact.first_offset == 98
    assert table.append(1, 0, 10, 2, 500, 0).error == ErrorCode.duplicate_sequence_number
    assert table.append(1, 0, 101, 1, 500, 0).error == ErrorCode.out_of_order_sequence_number


def test_expiry() -> None:
    table = ProducerStateTable(expiration_ms=1000)
    table.append(1, 0, 0, 1, 0, now_ms=0)
    table.append(2, 0, 0, 1, 1, now_ms=900)
    assert table.expire(now_ms=1500) == 1 and table.epoch_of(1) is None and len(table) == 1


def test_batches_to_retain_has_a_minimum_of_five() -> None:
    with pytest.raises(ValueError):
        ProducerStateTable(batches_to_retain=4)


def test_snapshot_round_trip_and_corruption(tmp_path: Path) -> None:
    table = ProducerStateTable(batches_to_retain=6)
    for pid in range(50):
        for i in range(8):
            table.append(pid, pid % 3, i * 2, 2, pid * 100 + i * 2, now_ms=pid)
    path = tmp_path / "state.snapshot"
    table.snapshot(path)
    restored = ProducerStateTable(batches_to_retain=6)
    restored.restore(path)
    for pid in range(50):
        assert restored.check(pid, pid % 3, 14, 2) == table.check(pid, pid % 3, 14, 2)
        assert restored.check(pid, pid % 3, 16, 1).appendable
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    untouched = ProducerStateTable()
    untouched.append(999, 0, 0, 1, 0, 0)
    with pytest.raises(CorruptSnapshot):
        untouched.restore(path)
    assert len(untouched) == 1 and untouched.epoch_of(999) == 0  # never half-loaded
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CorruptSnapshot):
        untouched.restore(path)


# -- property test against a model ------------------------------------------------------------


@dataclass
class ModelProducer:
    epoch: int = 0
    next_seq: int = 0
    accepted: list[tuple[int, int, int, int]] = field(
        default_factory=list
    )  # epoch, first, n, offset


action = st.one_of(
    st.tuples(st.just("send"), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("retry"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("gap"), st.integers(0, 3), st.integers(2, 9)),
    st.tuples(st.just("bump"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("stale"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(
    actions=st.lists(action, max_size=80),
    retain=st.integers(5, 8),
    near_wrap=st.booleans(),
)
def test_against_a_model(actions: list[tuple[str, int, int]], retain: int, near_wrap: bool) -> None:
    table = ProducerStateTable(batches_to_retain=retain)
    start = SEQUENCE_LIMIT - 6 if near_wrap else 0
    producers = {k: ModelProducer(next_seq=start) for k in range(4)}
    log_end = 0
    for kind, k, n in actions:
        p = producers[k]
        if kind == "restart":
            with tempfile.TemporaryDirectory() as tmp:
                table.snapshot(Path(tmp) / "s")
                table = ProducerStateTable(batches_to_retain=retain)
                table.restore(Path(tmp) / "s")
            continue
        if kind == "send":
            verdict = table.append(k, p.epoch, p.next_seq, n, log_end, 0)
            assert verdict.appendable, "an in-order batch was refused"
            p.accepted.append((p.epoch, p.next_seq, n, log_end))
            p.next_seq = (p.next_seq + n) % SEQUENCE_LIMIT
            log_end += n
        elif kind == "retry" and p.accepted:
            index = max(0, len(p.accepted) - n)
            epoch, first, count, offset = p.accepted[index]
            verdict = table.append(k, epoch, first, count, log_end, 0)
            assert not verdict.appendable, "a duplicate was accepted"
            same_epoch_after = [b for b in p.accepted[index:] if b[0] == epoch]
            if epoch == p.epoch and len(same_epoch_after) <= retain:
                assert verdict.duplicate and verdict.first_offset == offset  # the original
        elif kind == "gap":
            verdict = table.append(k, p.epoch, (p.next_seq + n) % SEQUENCE_LIMIT, 1, log_end, 0)
            if p.accepted:
                assert verdict.error == ErrorCode.out_of_order_sequence_number
            else:
                assert verdict.appendable  # an unknown producer is taken at any sequence
                p.accepted.append((p.epoch, (p.next_seq + n) % SEQUENCE_LIMIT, 1, log_end))
                p.next_seq = (p.next_seq + n + 1) % SEQUENCE_LIMIT
                log_end += 1
        elif kind == "bump":
            p.epoch += 1
            verdict = table.append(k, p.epoch, 0, 1, log_end, 0)
            assert verdict.appendable, "a bumped epoch starting at 0 was refused"
            p.accepted.append((p.epoch, 0, 1, log_end))
            p.next_seq = 1
            log_end += 1
        elif kind == "stale" and p.epoch > 0:
            verdict = table.append(k, p.epoch - 1, p.next_seq, 1, log_end, 0)
            assert verdict.error == ErrorCode.invalid_producer_epoch
