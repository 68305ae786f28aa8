"""Answers that wait for the log, written by the commit that makes them durable.

A connection task used to park until its round's answers were durable, wake, write them and
park again for the next request: two passes through the scheduler per durable request. Now
it posts the answers here and goes straight back to reading; the commit that makes them
durable writes them to the socket itself (:meth:`Outboxes.send_durable`, called by
``server/after_commit.py`` after each commit), and the kernel takes them at once. Nothing
is ever written before it is durable, and a connection's answers leave in the order they
were decided. Only when the kernel does not take all of it (a client that does not read)
does a task of its own finish the write, waiting for room.

Every answer leaves through here, TLS included. A TLS connection cannot write a byte without
awaiting (:class:`StreamIO`), so there is nothing for a commit to write at once: its task,
which would have nothing else to do, awaits :meth:`Outboxes.write_awaiting` (the write a
stalled plain outbox's task makes) after each round, before it reads again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from pidctl.controller.api.responses import NO_WAIT
from pidctl.controller.server.transport.socket_io import SocketIO, StreamIO

#: Each request's API name and when it was received (for the latency histogram).
Timings = Sequence[tuple[str, float]]


class Durability(Protocol):
    """What the outboxes need of the metadata log."""

    durable_end: int

    def awaited(self, offset: int) -> None: ...

    async def wait_durable(self, offset: int) -> None: ...


class Outbox:
    """One connection's answers not yet written, oldest first."""

    __slots__ = ("_emptied", "broken", "held", "io", "stalled")

    def __init__(self, io: SocketIO | StreamIO) -> None:
        self.io = io
        #: (log offset to wait for, answers, their timings); the rest of a partly written
        #: entry waits for nothing (NO_WAIT).
        self.held: collections.deque[tuple[int, bytes, Timings]] = collections.deque()
        self.broken = False
        self.stalled = False  # a task is finishing a write the kernel did not take whole
        self._emptied: trio.Event | None = None

    @property
    def requests(self) -> int:
        """Requests whose answers are held: the connection reads no more past its limit."""
        held = self.held
        if not held:
            return 0  # (the usual case, asked on every round)
        return sum(len(timings) for _, _, timings in held)

    @property
    def unwritten_bytes(self) -> int:
        """Bytes of the answers held: the connection reads no more past its limit either."""
        return sum(len(data) for _, data, _ in self.held)

    def full(self, max_requests: int, max_bytes: int) -> bool:
        """Whether the connection must read no more until its answers are written: as many
        requests wait for their answers as it may have in flight, or their answers hold
        ``max_bytes`` (a client that does not read its answers is muted, as Kafka mutes a
        channel whose response is not yet sent)."""
        held = self.held
        if not held:
            return False
        return self.requests >= max_requests or self.unwritten_bytes >= max_bytes

    async def wait_empty(self) -> None:
        """Until every answer held has been written (or the connection broke)."""
        while self.held:
            if self._emptied is None:
                self._emptied = trio.Event()
            await self._emptied.wait()

    def clear(self) -> None:
        """Forget every held answer; whoever waits for the outbox to empty goes on."""
        self.held.clear()
        if self._emptied is not None:
            self._emptied.set()
            self._emptied = None


class Outboxes:
    """Writes the answers of every connection's :class:`Outbox` once they are durable."""

    def __init__(self, log: Durability, on_sent: Callable[[int, Timings], None]) -> None:
        self._log = log
        self._on_sent = on_sent
        #: Outboxes holding answers for the log (insertion-ordered, as a set).
        self._waiting: dict[Outbox, None] = {}
        #: Starts a task finishing a stalled write: the connections' nursery (set by the
        #: server before it accepts), so shutdown's grace period bounds it as it bounds them.
        self.start_soon: Callable[..., Any] | None = None

    def post(self, outbox: Outbox, offset: int, data: bytes, timings: Timings) -> None:
        """Write ``data`` once the log is durable past ``offset``, after what the outbox
        holds already: at once if nothing is held and it is durable."""
        if outbox.broken:
            return
        if not outbox.held and not outbox.stalled and offset < self._log.durable_end:
            self._write(outbox, data, timings)
            return
        if outbox.held:
            offset = max(offset, outbox.held[-1][0])
        self._log.awaited(offset)
        outbox.held.append((offset, data, timings))
        if not outbox.stalled:
            self._waiting[outbox] = None

    def send_durable(self, durable_end: int) -> None:
        """After a commit: write every held answer that is now durable."""
        done = []
        for outbox in self._waiting:
            held = outbox.held
            if held[0][0] >= durable_end:
                continue
            parts: list[bytes] = []
            timings: list[tuple[str, float]] = []
            while held and held[0][0] < durable_end:
                _, data, times = held.popleft()
                parts.append(data)
                timings.extend(times)
            self._write(outbox, parts[0] if len(parts) == 1 else b"".join(parts), timings)
            if not held or outbox.stalled or outbox.broken:
                done.append(outbox)
        for outbox in done:
            del self._waiting[outbox]
            if not outbox.held:
                outbox.clear()

    def discard(self, outbox: Outbox) -> None:
        """The connection ends: nothing more is written for it (its descriptor is about to
        be closed, and its number may then be another connection's)."""
        outbox.broken = True
        outbox.io.close()  # a task finishing a write, already woken, must not write now
        self._waiting.pop(outbox, None)
        outbox.clear()

    def _write(self, outbox: Outbox, data: bytes, timings: Timings) -> None:
        try:
            sent = outbox.io.send_now(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The connection task sees it on its next read and ends; until then, nothing.
            outbox.broken = True
            outbox.clear()
            return
        self._on_sent(sent, timings if sent == len(data) else ())
        if sent < len(data):
            # The kernel's buffer is full: a task waits for room and writes the rest (and
            # whatever is held behind it) in order.
            outbox.held.appendleft((NO_WAIT, data[sent:], timings))
            outbox.stalled = True
            assert self.start_soon is not None, "Outboxes.start_soon is not set"
            self.start_soon(self._finish, outbox)

    async def write_awaiting(
        self, outbox: Outbox, offset: int, data: bytes, timings: Timings
    ) -> None:
        """Write ``data`` once the log is durable past ``offset``, awaiting the log and then
        room for all of it: a TLS connection's answers (its task awaits this after each
        round, and holds nothing), and a stalled outbox's (:meth:`_finish`). A connection
        that broke or ended is marked broken, and nothing more is written for it."""
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

    async def _finish(self, outbox: Outbox) -> None:
        """Write a stalled outbox's answers, waiting for room and for the log, until it is
        empty; the commits then write for it again."""
        held = outbox.held
        try:
            while held and not outbox.broken:
                offset, data, timings = held[0]
                await self.write_awaiting(outbox, offset, data, timings)
                if outbox.broken:  # (ended meanwhile: what it held is gone)
                    break
                held.popleft()  # only now: post() writes directly only when nothing is held
        finally:
            outbox.stalled = False
        outbox.clear()
