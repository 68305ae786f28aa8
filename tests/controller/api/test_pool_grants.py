"""The grant an idempotent answer waits for: its PID's block's, not everything before it."""

from __future__ import annotations

from pidctl.controller.api.pool_grants import PoolGrants
from pidctl.controller.core.records import ProducerIdsGranted, ProducerIdsReserved

EVERYTHING = 99  # what the caller passes: everything decided so far


def _pool_block(first: int) -> ProducerIdsGranted:
    return ProducerIdsGranted(1, -1, first, first + 1000, holder="controller")


def test_a_pid_waits_for_its_blocks_grant_and_later_blocks_for_theirs() -> None:
    grants = PoolGrants(blocks_held=2)
    grants.applied(3, _pool_block(0))
    grants.applied(4, ProducerIdsGranted(2, 5, 1000, 2000))  # a broker's block: not the pool's
    grants.applied(7, _pool_block(2000))
    assert grants.offset_of(0, EVERYTHING) == 3
    assert grants.offset_of(999, EVERYTHING) == 3  # the prefetch at offset 7 is not waited for
    assert grants.offset_of(2000, EVERYTHING) == 7
    assert grants.offset_of(2999, EVERYTHING) == 7


def test_a_pid_of_no_grant_noted_waits_for_everything() -> None:
    grants = PoolGrants(blocks_held=2)
    assert grants.offset_of(5, EVERYTHING) == EVERYTHING  # none noted (a grant before a restart)
    grants.applied(2, ProducerIdsReserved(100_000))
    grants.applied(3, _pool_block(1000))
    assert grants.offset_of(5, EVERYTHING) == EVERYTHING  # below the first block noted
    assert grants.offset_of(2000, EVERYTHING) == EVERYTHING  # past the last


def test_no_more_grants_are_kept_than_the_pool_holds_blocks() -> None:
    """A pool used only by transactional ids never looks a grant up: what it keeps stays
    bounded, and a PID of a grant forgotten waits for everything (safe, only later)."""
    grants = PoolGrants(blocks_held=2)
    for n in range(10):
        grants.applied(n, _pool_block(1000 * n))
    assert grants.offset_of(7000, EVERYTHING) == EVERYTHING  # forgotten
    assert grants.offset_of(8000, EVERYTHING) == 8
    assert grants.offset_of(9000, EVERYTHING) == 9
