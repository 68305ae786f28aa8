"""Answers held until the log has made what they decided durable: Kafka's controller
purgatory, which only completes what waits on an offset and knows nothing of sockets.

Each answer is held under a key (whoever sends it: one connection's writer) with the log
offset it waits for; :meth:`Purgatory.release` hands back, after a commit, every answer
now durable, per key in the order held, and keeps the rest. A key's answers leave in the
order they were decided: an answer held behind another waits for that one's offset too.
Pure: no I/O, no clock; the writers (``server/transport/outbox.py``) write what it releases.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

#: Each answer's API name and when its request was received (for the latency histogram).
Timings = Sequence[tuple[str, float]]

K = TypeVar("K", bound=Hashable)


class Purgatory(Generic[K]):
    """Answers by key, each waiting for a log offset to be durable."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        #: Per key, (offset to wait for, answers, their timings), oldest first; the keys in
        #: the order they began to wait (a dict as an ordered set).
        self._held: dict[K, collections.deque[tuple[int, bytes, Timings]]] = {}

    def hold(self, key: K, offset: int, data: bytes, timings: Timings) -> int:
        """Hold ``data`` until the log is durable past ``offset``, behind what ``key``
        holds already; the offset it waits for (never less than the one held before it)."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = collections.deque()
        elif held:
            offset = max(offset, held[-1][0])
        held.append((offset, data, timings))
        return offset

    def holds(self, key: K) -> bool:
        """Whether ``key`` has answers waiting."""
        return key in self._held

    def requests(self, key: K) -> int:
        """How many requests ``key``'s held answers answer."""
        held = self._held.get(key)
        return 0 if held is None else sum(len(timings) for _, _, timings in held)

    def held_bytes(self, key: K) -> int:
        """The bytes of ``key``'s held answers."""
        held = self._held.get(key)
        return 0 if held is None else sum(len(data) for _, data, _ in held)

    def release(self, durable_end: int) -> list[tuple[K, bytes, list[tuple[str, float]]]]:
        """Every answer durable now that the log is durable up to ``durable_end``
        (exclusive): per key, its released answers as one write and their timings, in the
        order the keys began to wait. The rest stay held."""
        released = []
        emptied = []
        for key, held in self._held.items():
            if held[0][0] >= durable_end:
                continue
            parts: list[bytes] = []
            timings: list[tuple[str, float]] = []
            while held and held[0][0] < durable_end:
                _, data, times = held.popleft()
                parts.append(data)
                timings.extend(times)
            released.append((key, parts[0] if len(parts) == 1 else b"".join(parts), timings))
            if not held:
                emptied.append(key)
        for key in emptied:
            del self._held[key]
        return released

    def drop(self, key: K) -> None:
        """Forget ``key``'s answers (its connection ended: nothing more is sent to it)."""
        self._held.pop(key, None)
