"""Muted connections, let go as soon as their client hangs up.

A connection over its quota is muted: nothing is read from it for the throttle time
(KIP-219), so that TCP pushes back on a client that does not wait. A client that closes its
end meanwhile (one that opens a new connection per request does, at once) must not leave
the muted connection open for the rest of the throttle, holding its place under
``max_connections`` and ``max_connections_per_address`` against every other client of its
address. Reading would end the mute, so the descriptor is watched for the hang-up alone:
``EPOLLRDHUP`` (the client's FIN, even behind requests it sent and we have not read) and
``EPOLLHUP``/``EPOLLERR`` (a reset), in one epoll set of our own for every muted connection,
one task waiting on it (as ``poller.py`` does for the reads). Linux only; elsewhere a mute
is a plain sleep.
"""

from __future__ import annotations

import contextlib
import select
from typing import Final

import trio

_HANGUP: Final = getattr(select, "EPOLLRDHUP", 0) | getattr(select, "EPOLLONESHOT", 0)


class Hangups:
    """Mutes connections (:meth:`mute`), ending a mute early when the client hangs up;
    :meth:`run` watches them."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") and _HANGUP else None
        self._muted: dict[int, trio.Event] = {}
        self._running = False

    def __len__(self) -> int:
        """Connections muted now."""
        return len(self._muted)

    async def mute(self, fd: int, seconds: float) -> bool:
        """Wait ``seconds``, or less if the client of ``fd`` hangs up meanwhile: True if it
        did. (-1, or no watch running: just the wait.)"""
        epoll = self._epoll
        if epoll is None or fd < 0 or not self._running:
            await trio.sleep(seconds)
            return False
        hung_up = trio.Event()
        self._muted[fd] = hung_up
        try:
            epoll.register(fd, _HANGUP)
        except OSError:  # (closed meanwhile: nothing to watch)
            del self._muted[fd]
            await trio.sleep(seconds)
            return False
        try:
            with trio.move_on_after(seconds):
                await hung_up.wait()
        finally:
            del self._muted[fd]
            # (OSError: the descriptor is closed, and so out of the set; ValueError: the
            # set is closed.)
            with contextlib.suppress(OSError, ValueError):
                epoll.unregister(fd)
        return hung_up.is_set()

    async def run(self) -> None:
        """Wake the mutes whose clients hang up, until cancelled; then close the set (the
        mutes still running sleep out their time: the shutdown's grace bounds them)."""
        epoll = self._epoll
        if epoll is None:
            await trio.sleep_forever()
            return
        self._running = True
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                for fd, _ in epoll.poll(0):
                    muted = self._muted.get(fd)
                    if muted is not None:
                        muted.set()  # (EPOLLONESHOT: reported once)
        finally:
            self._running = False
            trio.lowlevel.notify_closing(epoll.fileno())
            epoll.close()
            self._epoll = None
