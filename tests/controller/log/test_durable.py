"""The log's durable end: waiters wake once a commit passes their offset, and not before;
what someone waits for tells the log whether anyone waits past what is durable."""

from __future__ import annotations

import trio

from pidctl.controller.log.durable import DurableOffsets


async def test_a_waiter_wakes_once_a_commit_passes_its_offset() -> None:
    durable = DurableOffsets(3)
    woken: list[int] = []

    async def wait(offset: int) -> None:
        await durable.wait_durable(offset)
        woken.append(offset)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 2)  # durable already
        nursery.start_soon(wait, 4)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == [2]
        durable.advance(4)  # offset 3 durable, 4 not
        await trio.testing.wait_all_tasks_blocked()
        assert woken == [2]
        durable.advance(5)
    assert woken == [2, 4] and durable.durable_end == 5


def test_someone_waits_past_the_durable_end_until_it_is_reached() -> None:
    durable = DurableOffsets(10)
    assert not durable.waited_on()
    durable.awaited(9)  # durable already
    assert not durable.waited_on()
    durable.awaited(12)
    durable.awaited(11)  # (the highest counts)
    assert durable.waited_on() and durable.awaited_end == 13
    durable.advance(12)
    assert durable.waited_on()
    durable.advance(13)
    assert not durable.waited_on()
