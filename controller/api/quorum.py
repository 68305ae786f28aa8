"""The one place a decision's records apply: Kafka's ``QuorumController`` side of the
``ControllerApis`` / ``QuorumController`` line (less the quorum: one node, one log).

A manager decides and returns a :class:`~pidctl.controller.core.result.ControllerResult`;
:meth:`QuorumController.apply` replays its records onto the managers (which checks every
invariant first, so a record that would corrupt the log fails before it is appended) and
appends them to the log's buffer, which never waits. Whoever writes records goes through
here: the API handlers (``init_producer_id.py``, ``allocate_producer_ids.py``,
``cluster_apis.py``), start-up's bootstrap records
(``server/startup.py``) and the periodic expiries (``server/expiry.py``), the lease keeper,
``pidctl import-zk``. Snapshots are taken here too, at an instant between two decisions.
Decisions run one at a time on the event loop, so nothing needs a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from pidctl.controller.core.jobs import DEFAULT_EXPIRY_BATCH as DEFAULT_JOB_EXPIRY_BATCH
from pidctl.controller.core.logformat import RecordTooLarge, encode_entry
from pidctl.controller.core.records import Record
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState
from pidctl.controller.core.transactions import DEFAULT_EXPIRY_BATCH

T = TypeVar("T")


class RecordSink(Protocol):
    """Where records go to become durable (the metadata log)."""

    def append_entry(self, entry: bytes) -> int:
        """Buffer one encoded entry (:func:`encode_entry`); return its offset."""
        ...


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class Now:
    """Wall-clock time for records, monotonic time for sessions; both in milliseconds."""

    wall_ms: Final[int]
    mono_ms: Final[int]

    def __init__(self, wall_ms: int, mono_ms: int) -> None:
        self.wall_ms = wall_ms
        self.mono_ms = mono_ms


class QuorumController:
    """Applies results to one :class:`ControllerState` and its log, and snapshots them."""

    def __init__(
        self,
        state: ControllerState,
        sink: RecordSink,
        observers: Iterable[Callable[[int, Record], None]] = (),
    ) -> None:
        """``observers``: told of every record applied, in their order, with its offset,
        before it is durable (the pool's grants, the after-commit owner's pending audit
        lines, the lease keeper's wake-up)."""
        self.state = state
        self.sink = sink
        self.observers: Final[tuple[Callable[[int, Record], None], ...]] = tuple(observers)

    def apply(self, result: ControllerResult[T], now: Now) -> tuple[T, int]:
        """Replay a result's records and append them; return its response and the offset
        to wait for: everything decided so far, not just these records, since a response
        may report state (a retried registration's epoch, a PID of a pool block) that an
        earlier, still pending record made.

        Raises :class:`RecordTooLarge`, with nothing changed or written, for a record the
        log could not read back."""
        state, sink = self.state, self.sink
        records = result.records
        if records:
            # Encoded first: a record replay could not read back (RecordTooLarge) fails the
            # request before anything changes. Then replayed (every invariant checked before
            # the state changes), then appended.
            first = state.next_offset
            try:
                entries = [encode_entry(first + i, now.wall_ms, r) for i, r in enumerate(records)]
            except RecordTooLarge:
                # The decision may have filled the InitProducerId pool from a grant in this
                # result, now not logged: dropping the pool wastes a block or two, and never
                # hands out a PID twice.
                state.transactions.pool.clear()
                raise
            # (By index: compiled, zip(strict=True) is a call into the interpreter per apply.)
            for index, record in enumerate(records):
                entry = entries[index]
                offset = state.next_offset
                state.replay(offset, record)
                appended = sink.append_entry(entry)
                if appended != offset:
                    raise AssertionError(f"log offset {appended} != state offset {offset}")
                for observe in self.observers:
                    observe(offset, record)
        return result.response, state.next_offset - 1

    def snapshot(self) -> Callable[[], Iterator[tuple[int, Record]]]:
        """What the log needs for a snapshot at this instant (:func:`snapshot_of`)."""
        return snapshot_of(self.state)

    def expire_transactional_ids(
        self, now: Now, limit: int = DEFAULT_EXPIRY_BATCH
    ) -> tuple[int, int]:
        """Log an expiry for each of at most ``limit`` transactional ids unused past the
        setting, longest unused first; return how many, and the offset to wait for (fewer
        than ``limit``: none is left to expire)."""
        return self.apply(self.state.transactions.expire(now.wall_ms, limit), now)

    def expire_job_allocations(
        self, now: Now, limit: int = DEFAULT_JOB_EXPIRY_BATCH
    ) -> tuple[int, int]:
        """Log an expiry for each of at most ``limit`` job app ids unused past
        ``job_allocation_expiration_ms`` of running time (and the running time now and
        then); return how many, and the offset to wait for (fewer than ``limit``: none is
        left to expire)."""
        return self.apply(self.state.jobs.expire(now.wall_ms, now.mono_ms, limit), now)


def snapshot_of(state: ControllerState) -> Callable[[], Iterator[tuple[int, Record]]]:
    """What the log needs for a snapshot of ``state`` at this instant: a copy taken at once,
    its records (every manager's, ``ControllerState.snapshot_records``) made later."""
    return state.copy().snapshot_records
