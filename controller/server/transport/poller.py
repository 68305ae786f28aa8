"""One task reading every idle plain-TCP connection: the request path's reads, shared.

A task per connection waiting in ``wait_readable`` costs, on every request, a registration
with trio's epoll (one ``epoll_ctl``), a park and a wake-up of the task, and a pass of the
scheduler for it: a sixth of a durable request's CPU here. A connection with nothing else
to wait for instead *parks* here (:meth:`Poller.park`): its descriptor joins one epoll set
of our own, and when it is readable the poller calls the connection's round (read, decide,
post the answers) directly, for every ready connection in one pass. The round says when
the connection needs its own task again (a SASL exchange, a throttle, a full outbox, the
end of the connection); the task then wakes and goes on where the round left off.

The connection's task stays the owner of the connection (its cancel scope, its close);
parking is just another way for it to wait. Linux only (``select.epoll``):
:func:`available` says whether a poller can be had.
"""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable
from typing import Final

import trio

#: A connection's round, called when its descriptor is readable: True to stay parked, False
#: to wake the connection's task. An exception wakes the task too, and is raised there.
Round = Callable[[], bool]


#: Readable connections served in one pass before the poller lets the other tasks run (the
#: commit among them): a pass over thousands of busy connections would hold the loop for
#: as long. The kernel reports the rest (and these again, after them) on the next pass.
EVENTS_PER_PASS: Final = 256


def available() -> bool:
    """Whether this platform has what the poller needs (epoll)."""
    return hasattr(select, "epoll")


class _Parked:
    __slots__ = ("error", "round", "woken")

    def __init__(self, round: Round) -> None:
        self.round = round
        self.woken = trio.Event()
        self.error: BaseException | None = None


class Poller:
    """Runs the rounds of parked connections from one task (:meth:`run`)."""

    def __init__(self, events_per_pass: int = EVENTS_PER_PASS) -> None:
        self._epoll = select.epoll()
        self._events_per_pass = events_per_pass
        self._parked: dict[int, _Parked] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`run` has ended: a connection parking now is woken at once."""
        return self._closed

    def __len__(self) -> int:
        """Connections parked now."""
        return len(self._parked)

    async def park(self, fd: int, round: Round) -> None:
        """Wait until ``round``, called whenever ``fd`` is readable, returns False (or
        raises: raised here), or until the poller stops. Cancelling the wait unparks."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        parked = _Parked(round)
        self._parked[fd] = parked
        self._epoll.register(fd, select.EPOLLIN)
        try:
            await parked.woken.wait()
        finally:
            self._unpark(fd, parked)
        if parked.error is not None:
            raise parked.error

    async def run(self) -> None:
        """Call the round of every parked connection that is readable, until cancelled; then
        wake every parked connection and close the epoll set."""
        epoll = self._epoll
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                self.serve_ready()
        finally:
            self._closed = True
            for fd, parked in list(self._parked.items()):
                self._unpark(fd, parked)
                parked.woken.set()
            trio.lowlevel.notify_closing(epoll.fileno())
            epoll.close()

    def serve_ready(self) -> int:
        """One pass, without waiting: call the round of every parked connection readable
        now (at most ``events_per_pass``); how many were. Also called by the log's writer
        just before a commit, so that requests already received join it
        (``MetadataLog``'s ``before_commit``, as ``server/rooms.py`` decides)."""
        if self._closed:
            return 0
        ready = self._epoll.poll(0, self._events_per_pass)
        for fd, _ in ready:
            parked = self._parked.get(fd)
            if parked is None or parked.woken.is_set():
                continue  # unparked in this pass (a round may end another's)
            try:
                stay = parked.round()
            except Exception as e:  # for the connection's task, which owns it
                parked.error = e
                stay = False
            if not stay:
                self._unpark(fd, parked)
                parked.woken.set()
        return len(ready)

    def _unpark(self, fd: int, parked: _Parked) -> None:
        if self._parked.get(fd) is parked:
            del self._parked[fd]
            # (OSError: the descriptor is closed, and so out of the set; ValueError: the set
            # is closed.)
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
