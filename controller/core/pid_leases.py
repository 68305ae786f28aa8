"""Leases: the ranges a controller of a fleet took from the PID counter it shares (etcd,
``docs/fleets.md``), and grants only from (pure; the lease keeper does the I/O).

Each lease is recorded in the log (:class:`ProducerIdsLeased`) before any PID of it is
granted; grants come from the first lease with room for a block, and a lease whose rest is
too small for one is abandoned. The next lease is taken while less than
``prefetch_ratio`` of a lease is left, so a lease's round trip never stands between a
broker and its block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import BLOCK_SIZE, INT64_MAX
from pidctl.controller.core.records import LeasesState, ProducerIdsLeased, Record
from pidctl.controller.core.result import ControllerResult

DEFAULT_LEASE_SIZE: Final = 1_000_000
DEFAULT_PREFETCH_RATIO: Final = 0.5


class ProducerIdSpaceExhausted(Exception):
    """The next lease would pass the largest PID Kafka allows."""


@dataclass(frozen=True, slots=True)
class Lease:
    """PIDs ``[first, end)`` leased from the shared source and not yet used up."""

    first: int
    end: int


@dataclass(slots=True)
class LeaseManager:
    """The leases held, oldest first. ``granted`` reads the producer-id manager's
    high-water mark (no PID at or above it was granted)."""

    granted: Callable[[], int] = field(compare=False, repr=False)
    #: Set by the first lease: from then on every grant must lie inside a lease.
    lease_mode: bool = False
    leases: list[Lease] = field(default_factory=list)
    #: The end of the highest lease this log ever took: the shared counter was at least this
    #: high, and a counter seen below it went back (corruption of the shared source).
    highest_lease_end: int = 0

    # -- decisions ------------------------------------------------------------------------

    def wants_lease(self, lease_size: int, prefetch_ratio: float) -> bool:
        """True while what is left of the leases held is below the prefetch threshold."""
        return self.remaining() < max(BLOCK_SIZE, lease_size * prefetch_ratio)

    def lease_bounds(self, counter: int, lease_size: int) -> tuple[int, int]:
        """The range ``[first, end)`` to lease when the shared counter says ``counter``.

        It starts no lower than this controller's own high-water mark: a data dir that
        granted PIDs before it used etcd (or an etcd that lost its data) must not lease them
        again. Raises :class:`ProducerIdSpaceExhausted` past the largest PID.
        """
        first = max(counter, self.high_water())
        end = first + lease_size
        if end > INT64_MAX:
            raise ProducerIdSpaceExhausted(f"a lease at {first} would pass {INT64_MAX}")
        return first, end

    def lease(self, first: int, end: int, source: str, revision: int) -> ControllerResult[None]:
        """Record a lease taken from the shared counter (before any PID of it is granted)."""
        return ControllerResult((ProducerIdsLeased(first, end, source, revision),), None)

    # -- queries --------------------------------------------------------------------------

    def block_start(self) -> int | None:
        """Where the next block starts in the leases held, or None when none has room."""
        granted = self.granted()
        for lease in self.leases:
            first = max(granted, lease.first)
            if first + BLOCK_SIZE <= lease.end:
                return first
        return None

    def room(self, end: int) -> int:
        """Where the PIDs that may follow ``end`` end: the end of the lease holding ``end``
        (``end`` itself when none does)."""
        return max([end] + [lease.end for lease in self.leases if lease.first < end <= lease.end])

    def high_water(self) -> int:
        """Nothing at or above this was granted or leased through this log."""
        return max([self.granted()] + [lease.end for lease in self.leases])

    def remaining(self) -> int:
        """PIDs still grantable, in whole blocks, from the leases held."""
        granted = self.granted()
        blocks = sum(
            max(0, lease.end - max(lease.first, granted)) // BLOCK_SIZE for lease in self.leases
        )
        return blocks * BLOCK_SIZE

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply a lease (or a snapshot's :class:`LeasesState`); checks come before any
        change."""
        if isinstance(record, LeasesState):
            self.lease_mode = self.lease_mode or record.lease_mode
            self.highest_lease_end = max(self.highest_lease_end, record.highest_lease_end)
        elif isinstance(record, ProducerIdsLeased):
            held_end = self.high_water()
            if record.first_producer_id < held_end:
                raise InvariantViolation(
                    f"offset {offset}: lease starts at {record.first_producer_id}, below "
                    f"what is already granted or leased ({held_end})"
                )
            if record.next_producer_id <= record.first_producer_id:
                raise InvariantViolation(f"offset {offset}: empty or inverted lease")
            self.lease_mode = True
            self.leases.append(Lease(record.first_producer_id, record.next_producer_id))
            self.highest_lease_end = max(self.highest_lease_end, record.next_producer_id)

    def check_grant(self, offset: int, first: int, end: int) -> int:
        """Index of the held lease ``[first, end)`` lies in (a grant being replayed); a grant
        outside every lease is corrupt."""
        for index, lease in enumerate(self.leases):
            if lease.first <= first and end <= lease.end:
                return index
        raise InvariantViolation(
            f"offset {offset}: grant [{first}, {end}) lies outside every lease held"
        )

    def granted_up_to(self, end: int, used: int = 0) -> None:
        """PIDs below ``end`` are granted (a grant from lease ``used``, or a raised floor):
        leases before the one used are abandoned (their rest is too small), and used-up
        ones dropped."""
        self.leases = [lease for lease in self.leases[used:] if lease.end > end]

    # -- snapshots ------------------------------------------------------------------------

    def copy(self, granted: Callable[[], int]) -> LeaseManager:
        return LeaseManager(granted, self.lease_mode, list(self.leases), self.highest_lease_end)

    def snapshot_records(self, at: int) -> Iterator[tuple[int, Record]]:
        """The leases held, restated at offset ``at`` (before the high-water mark's record:
        a lease replays only above what is granted)."""
        for lease in self.leases:
            yield at, ProducerIdsLeased(lease.first, lease.end, "snapshot")
        if self.lease_mode:
            yield at, LeasesState(self.lease_mode, self.highest_lease_end)
