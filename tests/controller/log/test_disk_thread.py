"""The log's commit thread: calls run in it, in order; results and exceptions come back to
the calling task; a call that has started is waited for even when its caller is cancelled."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from pidctl.controller.log.disk_thread import DiskThread


async def test_calls_run_in_the_thread_in_order_and_return_their_results() -> None:
    disk = DiskThread("test-disk")
    try:
        seen: list[tuple[int, str]] = []

        def job(n: int) -> int:
            seen.append((n, threading.current_thread().name))
            return n * n

        assert [await disk.call(job, n) for n in range(5)] == [0, 1, 4, 9, 16]
        assert seen == [(n, "test-disk") for n in range(5)]
    finally:
        disk.close()


async def test_an_exception_is_raised_in_the_caller() -> None:
    disk = DiskThread("test-disk")
    try:
        with pytest.raises(OSError, match="disk on fire"):
            await disk.call(_fail)
        assert await disk.call(len, "still serving") == 13
    finally:
        disk.close()


def _fail() -> None:
    raise OSError(5, "disk on fire")


async def test_a_started_call_is_waited_for_when_its_caller_is_cancelled() -> None:
    disk = DiskThread("test-disk")
    release = threading.Event()
    outcome: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def caller() -> None:
                with scope:
                    outcome.append(await disk.call(_blocked_until, release))
                    await trio.lowlevel.checkpoint()  # the pending cancel lands here

            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []  # still waiting for the call, though cancelled
            release.set()
        assert outcome == ["done"] and scope.cancelled_caught
    finally:
        release.set()
        disk.close()


def _blocked_until(release: threading.Event) -> str:
    if not release.wait(30):
        raise TimeoutError("never released")
    return "done"


async def test_close_ends_the_thread() -> None:
    disk = DiskThread("test-disk-close")
    await disk.call(int)
    disk.close()
    assert not any(t.name == "test-disk-close" for t in threading.enumerate())
