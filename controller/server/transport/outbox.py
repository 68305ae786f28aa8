"""The writers: every answer leaves through one, once the log has made it durable.

A connection task used to park until its round's answers were durable, wake, write them and
park again for the next request: two passes through the scheduler per durable request. Now
it posts the answers and goes straight back to reading. On plain TCP the
:class:`SocketWriter` writes an answer at once if what it decided is durable already, and
else holds it in the controller's :class:`~pidctl.controller.api.purgatory.Purgatory`
(which knows no sockets); after each commit ``server/after_commit.py`` has it write what
the purgatory releases (:meth:`SocketWriter.release`), and the kernel takes it at once.
Nothing is ever written before it is durable, and a connection's answers leave in the order
they were decided. Only when the kernel does not take all of it (a client that does not
read) does a task of the writer's own finish the write, waiting for room.

A TLS connection cannot write a byte without awaiting (:class:`StreamIO`), so there is
nothing for a commit to write at once: its task, which would have nothing else to do,
awaits the :class:`StreamWriter`'s write (the log, then room) after each round, before it
reads again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Protocol

import trio

from pidctl.controller.api.purgatory import Purgatory, Timings
from pidctl.controller.server.transport.socket_io import SocketIO, StreamIO

__all__ = ["Durability", "OnSent", "Outbox", "SocketWriter", "StreamWriter", "Timings"]

#: Told of every write: its bytes, and the timings of the answers it finished.
OnSent = Callable[[int, Timings], None]


class Durability(Protocol):
    """What the writers need of the metadata log."""

    durable_end: int

    def awaited(self, offset: int) -> None: ...

    async def wait_durable(self, offset: int) -> None: ...


class Outbox:
    """One connection's answers not yet written: held in the purgatory for the log, or
    durable and waiting for room in the kernel (``unsent``, a stalled write's rest and
    what came behind it), oldest first."""

    __slots__ = ("_emptied", "_purgatory", "broken", "io", "stalled", "unsent")

    def __init__(self, io: SocketIO | StreamIO, purgatory: Purgatory[Outbox]) -> None:
        self.io = io
        self._purgatory = purgatory
        self.unsent: collections.deque[tuple[bytes, Timings]] = collections.deque()
        self.broken = False
        self.stalled = False  # a task is finishing a write the kernel did not take whole
        self._emptied: trio.Event | None = None

    @property
    def empty(self) -> bool:
        """Whether every answer posted has been written (or the connection broke)."""
        return not self.stalled and not self.unsent and not self._purgatory.holds(self)

    @property
    def requests(self) -> int:
        """Requests whose answers are not yet written: past its limit the connection reads
        no more."""
        held = self._purgatory.held(self)
        count = 0 if held is None else held.requests
        if self.unsent:  # (rarely: a client that does not read)
            count += sum(len(timings) for _, timings in self.unsent)
        return count

    @property
    def unwritten_bytes(self) -> int:
        """Bytes of the answers not yet written: the connection reads no more past its
        limit either."""
        held = self._purgatory.held(self)
        return sum(len(data) for data, _ in self.unsent) + (0 if held is None else held.bytes)

    def full(self, max_requests: int, max_bytes: int) -> bool:
        """Whether the connection must read no more until its answers are written: as many
        requests wait for their answers as it may have in flight, or their answers hold
        ``max_bytes`` (a client that does not read its answers is muted, as Kafka mutes a
        channel whose response is not yet sent)."""
        held = self._purgatory.held(self)  # (asked on every round: one lookup)
        if held is None:
            if not self.unsent:
                return False  # (the usual case)
            requests = size = 0
        else:
            requests, size = held.requests, held.bytes
        for data, timings in self.unsent:
            requests += len(timings)
            size += len(data)
        return requests >= max_requests or size >= max_bytes

    async def wait_empty(self) -> None:
        """Until every answer posted has been written (or the connection broke)."""
        while not self.empty:
            if self._emptied is None:
                self._emptied = trio.Event()
            await self._emptied.wait()

    def forget(self) -> None:
        """Forget every answer not yet written (the connection broke or ended)."""
        self._purgatory.drop(self)
        self.unsent.clear()
        self.woken()

    def woken(self) -> None:
        """Wake whoever waits for the outbox to empty, if it has."""
        if self._emptied is not None and self.empty:
            self._emptied.set()
            self._emptied = None


class SocketWriter:
    """Writes plain TCP connections' answers on their descriptors: at once when durable,
    else what the purgatory releases after each commit; a write the kernel does not take
    whole is finished by a task of its own (:meth:`run` starts them)."""

    def __init__(self, log: Durability, on_sent: OnSent) -> None:
        self._log = log
        self._on_sent = on_sent
        #: The answers that wait for the log, every plain connection's.
        self.purgatory: Purgatory[Outbox] = Purgatory()
        self._nursery: trio.Nursery | None = None

    def outbox(self, io: SocketIO | StreamIO) -> Outbox:
        """A new connection's outbox."""
        return Outbox(io, self.purgatory)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Finish stalled writes until cancelled: a task each, in a nursery of the
        writer's own (run it beside the connections: shutdown's grace period bounds both)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def post(self, outbox: Outbox, offset: int, data: bytes, timings: Timings) -> None:
        """Write ``data`` once the log is durable past ``offset``, after what the outbox
        holds already: at once if nothing is held and it is durable."""
        if outbox.broken:
            return
        durable = offset < self._log.durable_end
        if durable and not self.purgatory.holds(outbox):
            if outbox.stalled:
                outbox.unsent.append((data, timings))  # behind the stalled write, in order
            else:
                self._write(outbox, data, timings)
            return
        self._log.awaited(self.purgatory.hold(outbox, offset, data, timings))

    def release(self, durable_end: int) -> None:
        """After a commit: write every answer the purgatory releases."""
        for outbox, data, timings in self.purgatory.release(durable_end):
            if outbox.stalled:
                outbox.unsent.append((data, timings))  # the finishing task writes it
            else:
                self._write(outbox, data, timings)
                outbox.woken()

    def discard(self, outbox: Outbox) -> None:
        """The connection ends: nothing more is written for it (its descriptor is about to
        be closed, and its number may then be another connection's)."""
        outbox.broken = True
        outbox.io.close()  # a task finishing a write, already woken, must not write now
        outbox.forget()

    def _write(self, outbox: Outbox, data: bytes, timings: Timings) -> None:
        try:
            sent = outbox.io.send_now(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The connection task sees it on its next read and ends; until then, nothing.
            outbox.broken = True
            outbox.forget()
            return
        self._on_sent(sent, timings if sent == len(data) else ())
        if sent < len(data):
            # The kernel's buffer is full: a task waits for room and writes the rest (and
            # whatever comes behind it) in order.
            outbox.unsent.appendleft((data[sent:], timings))
            outbox.stalled = True
            assert self._nursery is not None, "SocketWriter.run is not running"
            self._nursery.start_soon(self._finish, outbox)

    async def _finish(self, outbox: Outbox) -> None:
        """Write a stalled outbox's durable answers, waiting for room, until none is left;
        the commits then write for it again."""
        unsent = outbox.unsent
        try:
            while unsent and not outbox.broken:
                data, timings = unsent[0]
                try:
                    await outbox.io.send_all(data)  # refuses once the connection has ended
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    outbox.broken = True
                    break
                unsent.popleft()
                self._on_sent(len(data), timings)
        finally:
            outbox.stalled = False
        if outbox.broken:
            outbox.forget()
        outbox.woken()


class StreamWriter:
    """Writes TLS connections' answers: each round's, awaited by the connection's task
    (the log, then room for all of it); nothing is held."""

    def __init__(self, log: Durability, on_sent: OnSent) -> None:
        self._log = log
        self._on_sent = on_sent

    async def write(self, outbox: Outbox, offset: int, data: bytes, timings: Timings) -> None:
        """Write ``data`` once the log is durable past ``offset``. A connection that broke
        or ended is marked broken, and nothing more is written for it."""
        if outbox.broken:
            return
        try:
            if offset >= self._log.durable_end:  # (else no call: durable, or NO_WAIT)
                await self._log.wait_durable(offset)
                if outbox.broken:  # the connection ended meanwhile
                    return
            await outbox.io.send_all(data)  # refuses once the connection has ended
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            outbox.broken = True
            return
        self._on_sent(len(data), timings)
