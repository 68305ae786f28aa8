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


class HeldAnswers:
    """One key's held answers, oldest first, and their totals (read on every round: a
    connection reads no more past its limits)."""

    __slots__ = ("answers", "bytes", "requests")

    def __init__(self) -> None:
        #: (offset to wait for, answers, their timings).
        self.answers: collections.deque[tuple[int, bytes, Timings]] = collections.deque()
        self.requests = 0  # the requests they answer
        self.bytes = 0


class Purgatory(Generic[K]):
    """Answers by key, each waiting for a log offset to be durable."""

    __slots__ = ("_spare", "_waiting")

    def __init__(self) -> None:
        #: The keys with answers held, in the order they began to wait (a dict as an
        #: ordered set).
        self._waiting: dict[K, HeldAnswers] = {}
        #: Emptied queues, for the next key that begins to wait: nearly every request
        #: waits for a commit, and a queue made for each would cost as much as the rest
        #: of holding it. (No more of them than keys that ever waited at once.)
        self._spare: list[HeldAnswers] = []

    def hold(self, key: K, offset: int, data: bytes, timings: Timings) -> int:
        """Hold ``data`` until the log is durable past ``offset``, behind what ``key``
        holds already; the offset it waits for (never less than the one held before it)."""
        held = self._waiting.get(key)
        if held is None:
            held = self._waiting[key] = self._spare.pop() if self._spare else HeldAnswers()
        else:  # (a key waits only while it holds answers)
            offset = max(offset, held.answers[-1][0])
        held.answers.append((offset, data, timings))
        held.requests += len(timings)
        held.bytes += len(data)
        return offset

    def holds(self, key: K) -> bool:
        """Whether ``key`` has answers waiting."""
        return key in self._waiting

    def held(self, key: K) -> HeldAnswers | None:
        """``key``'s held answers and their totals, if it has any (read, not changed)."""
        return self._waiting.get(key)

    def requests(self, key: K) -> int:
        """How many requests ``key``'s held answers answer."""
        held = self._waiting.get(key)
        return 0 if held is None else held.requests

    def held_bytes(self, key: K) -> int:
        """The bytes of ``key``'s held answers."""
        held = self._waiting.get(key)
        return 0 if held is None else held.bytes

    def release(self, durable_end: int) -> list[tuple[K, bytes, list[tuple[str, float]]]]:
        """Every answer durable now that the log is durable up to ``durable_end``
        (exclusive): per key, its released answers as one write and their timings, in the
        order the keys began to wait. The rest stay held."""
        released = []
        emptied = []
        for key, held in self._waiting.items():
            answers = held.answers
            if answers[0][0] >= durable_end:
                continue
            parts: list[bytes] = []
            timings: list[tuple[str, float]] = []
            while answers and answers[0][0] < durable_end:
                _, data, times = answers.popleft()
                parts.append(data)
                timings.extend(times)
                held.requests -= len(times)
                held.bytes -= len(data)
            released.append((key, parts[0] if len(parts) == 1 else b"".join(parts), timings))
            if not answers:
                emptied.append(key)
        for key in emptied:
            self._spare.append(self._waiting.pop(key))
        return released

    def drop(self, key: K) -> None:
        """Forget ``key``'s answers (its connection ended: nothing more is sent to it)."""
        held = self._waiting.pop(key, None)
        if held is not None:
            held.answers.clear()
            held.requests = held.bytes = 0
            self._spare.append(held)
