"""One thread for the metadata log's commits: blocking disk calls, handed over with as little
work as a hand-over can be.

``trio.to_thread.run_sync`` per group commit costs the event loop and the worker more Python
than the commit's own ``write`` and ``fdatasync`` calls do (a capacity limiter, a copied
context, a thread cache, the thread renamed for every job), and every step the worker runs in
Python waits for the GIL of a busy loop. The log's writer is a single caller making one call
at a time, so one long-lived thread and a queue do: the thread takes a job, runs it, and
reschedules the waiting task through the loop's token.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], Callable[[outcome.Outcome[Any]], None]]


class DiskThread:
    """A thread running blocking calls for trio tasks, one at a time, in order."""

    def __init__(self, name: str) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name=name, daemon=True)
        self._worker.start()

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the thread: its result, or its exception raised here.

        Not cancellable, as ``trio.to_thread.run_sync`` by default: a disk call that has
        started is waited for, so that its outcome is known before anyone is told anything."""
        task = trio.lowlevel.current_task()
        token = self._token

        def report(result: outcome.Outcome[Any]) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._jobs.put((function, args, report))
        result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return result

    def close(self) -> None:
        """Let the thread finish the job it has (if any) and end."""
        self._jobs.put(None)
        self._worker.join()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, args, report = job
            report(outcome.capture(function, *args))
