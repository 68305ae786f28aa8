"""A connection's reads and writes: a plain TCP connection's on its descriptor
(:class:`SocketIO`), a TLS connection's through trio's ``SSLStream`` (:class:`StreamIO`); and
the close of a socket trio may be waiting on (:func:`close_socket`).

trio's ``SocketStream`` tries every read before it waits, and after every read or write that
succeeds it passes through the scheduler once more. A client that sends a request and waits
for its answer (almost every Kafka client) has nothing for us right after we answered, so
every request paid for a failed ``recv`` with its exception and for two extra passes through
the scheduler: a fifth of the request path's own time. Here a read waits for the socket to be
readable first, and a write the kernel takes whole returns without a pass. The waits are
trio's own (``wait_readable``, ``wait_writable``): cancellation, and a close from another
task, end them as they end trio's socket operations.

TLS connections keep trio's ``SSLStream``: nothing of it is written without awaiting
(:meth:`StreamIO.send_now` takes nothing), so its answers leave by the outbox's awaiting write.

The descriptor is only a number: once the connection is done with it, :meth:`SocketIO.close`
makes every later read or write refuse, since after the socket is closed the number may be
another connection's (or a log file's).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable

import trio


def close_socket(sock: socket.socket) -> None:
    """Close ``sock``, first waking (with ``trio.ClosedResourceError``) every task waiting
    on it in trio (a write waiting for room): trio must forget a descriptor before its
    number can be another's. Closing a closed socket does nothing."""
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock)
        sock.close()


class SocketIO:
    """``receive_some``/``send_all`` of a TCP socket, on its descriptor.

    ``send_all`` is not a checkpoint when the kernel takes everything at once: a connection
    loop using it must wait somewhere else on every round (the next read does). After
    :meth:`close`, reads and writes raise ``trio.ClosedResourceError``."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def close(self) -> None:
        """The connection is done with the descriptor: nothing is read or written any more,
        even by a task that was woken before this and has not run yet. (Closing the socket
        itself is its owner's business: :func:`close_socket`.)"""
        self._fd = -1

    def _descriptor(self) -> int:
        if self._fd < 0:
            raise trio.ClosedResourceError("the connection is closed")
        return self._fd

    @property
    def fileno(self) -> int:
        """The descriptor (for a poller); raises ``trio.ClosedResourceError`` after
        :meth:`close`."""
        return self._descriptor()

    async def receive_some(self, max_bytes: int) -> bytes:
        """Wait until the socket is readable, then read up to ``max_bytes``; ``b""`` at the
        end of the stream. Raises ``trio.BrokenResourceError`` if the connection broke."""
        while True:
            await trio.lowlevel.wait_readable(self._descriptor())
            data = self.receive_now(max_bytes)
            if data is not None:
                return data
            # readable, then not: wait again

    def receive_now(self, max_bytes: int) -> bytes | None:
        """Read up to ``max_bytes`` without waiting: None if there is nothing yet, ``b""`` at
        the end of the stream. Raises ``trio.BrokenResourceError`` if the connection broke,
        and ``trio.ClosedResourceError`` after :meth:`close`."""
        try:
            return os.read(self._descriptor(), max_bytes)
        except BlockingIOError:
            return None
        except OSError as e:
            raise trio.BrokenResourceError(f"read failed: {e}") from e

    def send_now(self, data: bytes | memoryview) -> int:
        """Write what the kernel takes of ``data`` now, without waiting; how many bytes.
        Raises ``trio.BrokenResourceError`` if the connection broke, and
        ``trio.ClosedResourceError`` after :meth:`close`."""
        try:
            return os.write(self._descriptor(), data)
        except BlockingIOError:
            return 0
        except OSError as e:
            raise trio.BrokenResourceError(f"write failed: {e}") from e

    async def send_all(self, data: bytes | memoryview) -> None:
        """Write all of ``data``, waiting for room only when the kernel's buffer is full.
        Raises ``trio.BrokenResourceError`` if the connection broke."""
        view = memoryview(data)
        while view:
            # (Two statements: compiled by mypyc 2.4, the one-statement form,
            # ``view = view[self.send_now(view) :]``, never finished a write the kernel
            # took in parts; tests/controller/server/transport/test_outbox.py shows it.)
            sent = self.send_now(view)
            view = view[sent:]
            if view:
                await trio.lowlevel.wait_writable(self._descriptor())


class StreamIO:
    """A TLS connection's ``receive_some``/``send_all``: trio's ``SSLStream``'s own (bound
    once: no call of ours between a request and its stream), with :class:`SocketIO`'s
    :meth:`close` and :meth:`send_now`. TLS cannot write a byte without awaiting (the record
    is encrypted, then sent by trio), so an outbox writes through ``send_all``
    (``StreamWriter.write``)."""

    __slots__ = ("receive_some", "send_all")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.receive_some: Callable[[int], Awaitable[bytes | bytearray]] = stream.receive_some
        self.send_all: Callable[[bytes | memoryview], Awaitable[None]] = stream.send_all

    def close(self) -> None:
        """Nothing to forget: no descriptor is held here, and the stream, once its owner has
        closed it, refuses every read and write itself."""

    def send_now(self, data: bytes | memoryview) -> int:
        """Nothing, ever: a TLS write awaits (``send_all``)."""
        return 0
