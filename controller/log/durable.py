"""Which log offsets are on disk, and how far someone waits for them.

The metadata log's writer moves the durable end after each commit (:meth:`advance`); the
answers' writers (``server/transport/outbox.py``) and whoever waits for a record read it
here. Built before the log, so that what the log tells after a commit (the after-commit
listener, the writer it has write) can be handed what it needs at construction too.
"""

from __future__ import annotations

import trio


class DurableOffsets:
    """The durable end of the log (every offset below it is on disk), and one past the
    highest offset someone waits for. After a storage failure the end never moves again,
    so nothing more is answered."""

    def __init__(self, end_offset: int) -> None:
        #: Every offset below this is on disk.
        self.durable_end = end_offset
        #: One past the highest offset someone waits for (:meth:`awaited`).
        self.awaited_end = end_offset
        self._event = trio.Event()

    def awaited(self, offset: int) -> None:
        """Someone waits for the record at ``offset`` to be durable (an answer held for it).

        A commit nobody waits for (a prefetched block's grant) runs in the log's thread
        (:meth:`SyncPlace.in_thread_for`)."""
        if offset >= self.awaited_end:
            self.awaited_end = offset + 1

    def waited_on(self) -> bool:
        """Whether someone waits past what is durable already."""
        return self.awaited_end > self.durable_end

    async def wait_durable(self, offset: int) -> None:
        """Return once the record at ``offset`` (and every one before it) is on disk; after
        a storage failure, never (the process is going down)."""
        self.awaited(offset)
        while self.durable_end <= offset:
            await self._event.wait()

    def advance(self, durable_end: int) -> None:
        """A commit made every offset below ``durable_end`` durable: wake the waiters."""
        self.durable_end = durable_end
        done, self._event = self._event, trio.Event()
        done.set()
