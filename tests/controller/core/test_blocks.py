from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.sampled_from([0.1, 0.5, 0.9, 0.95, 1.0]),
    depth=st.integers(1, 3),
    block_size=st.integers(1, 40),
    steps=st.lists(st.tuples(st.integers(1, 60), st.booleans()), max_size=30),
)
def test_a_run_takes_what_takes_one_by_one_would_before_a_block_is_wanted(
    threshold: float, depth: int, block_size: int, steps: list[tuple[int, bool]]
) -> None:
    """``take_run`` against ``take`` on a twin pool: the same PIDs, ``wants_block()`` False
    before every take but the first, and the run as long as it may be (``most``, or up to
    a wanted block or the current block's end); blocks are added whenever one is wanted
    (a step may add one), as a holder asking before each take would."""
    pool, twin = (ProducerIdPool(threshold, depth) for _ in range(2))
    next_block = 0
    for most, add in steps:
        if add and pool.wants_block():
            pool.add_block(next_block, block_size)
            twin.add_block(next_block, block_size)
            next_block += block_size
        run = list(pool.take_run(most))
        for i, pid in enumerate(run):
            assert i == 0 or not twin.wants_block()
            assert twin.take() == pid
        if run and len(run) < most:
            # Cut short: a block is wanted, or the current one ended (blocks here are
            # [k * block_size, (k + 1) * block_size)).
            assert twin.wants_block() or (run[-1] + 1) % block_size == 0
        elif not run:
            assert twin.take() is None
        assert pool.remaining == twin.remaining
