from __future__ import annotations

import pytest

from pidctl.controller.core.blocks import InvalidBlock, ProducerIdPool
from pidctl.controller.core.kafka import INT64_MAX


def test_empty_pool_wants_a_block_and_has_nothing() -> None:
    pool = ProducerIdPool()
    assert pool.wants_block()
    assert pool.take() is None


def test_prefetch_at_ninety_percent_and_switch_over() -> None:
    pool = ProducerIdPool()
    pool.add_block(0, 1000)
    taken = [pool.take() for _ in range(899)]
    assert taken[0] == 0 and taken[-1] == 898
    assert not pool.wants_block()
    assert pool.take() == 899  # 900 used: time to ask for the next block
    assert pool.wants_block()
    pool.add_block(1000, 1000)
    assert not pool.wants_block()
    rest = [pool.take() for _ in range(100)]
    assert rest[-1] == 999
    assert pool.take() == 1000
    assert pool.remaining == 999


def test_depth_holds_more_blocks_ahead() -> None:
    pool = ProducerIdPool(depth=2)
    pool.add_block(0, 10)
    for _ in range(9):
        pool.take()
    assert pool.wants_block()
    pool.add_block(10, 10)
    assert pool.wants_block()  # one ahead, two wanted
    pool.add_block(20, 10)
    assert not pool.wants_block()
    assert pool.blocks_ahead == 2


@pytest.mark.parametrize(("first", "length"), [(-1, 1000), (0, 0), (0, -5), (INT64_MAX - 10, 1000)])
def test_negative_empty_or_overflowing_blocks_are_refused(first: int, length: int) -> None:
    with pytest.raises(InvalidBlock):
        ProducerIdPool().add_block(first, length)


def test_overlapping_block_is_refused() -> None:
    pool = ProducerIdPool()
    pool.add_block(1000, 1000)
    with pytest.raises(InvalidBlock):
        pool.add_block(1500, 1000)
