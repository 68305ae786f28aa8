from __future__ import annotations

import pytest

from controller.pid_pool import ProducerIdPool


def test_empty_pool_wants_a_block_and_has_nothing() -> None:
    pool = ProducerIdPool()
    assert pool.wants_block()
    assert pool.take() is None


def test_prefetch_at_ninety_percent_and_switch_over() -> None:
    pool = ProducerIdPool()
    pool.add_block(0, 1000, grant_offset=5)
    taken = [pool.take() for _ in range(899)]
    assert taken[0] == (0, 5) and taken[-1] == (898, 5)
    assert not pool.wants_block()
    assert pool.take() == (899, 5)  # 900 used: time to ask for the next block
    assert pool.wants_block()
    pool.add_block(1000, 2000, grant_offset=9)
    assert not pool.wants_block()
    rest = [pool.take() for _ in range(100)]
    assert rest[-1] == (999, 5)
    assert pool.take() == (1000, 9)  # the next PID carries the next block's grant offset
    assert pool.remaining == 999


def test_overlapping_block_is_rejected() -> None:
    pool = ProducerIdPool()
    pool.add_block(1000, 2000, 1)
    with pytest.raises(ValueError):
        pool.add_block(1500, 2500, 2)
