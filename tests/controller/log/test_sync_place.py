"""Where a commit runs: on the loop while syncs are quick, in the thread after a slow one."""

from __future__ import annotations

import math

from pidctl.controller.log.sync_place import BACK_OFF_WINDOW, QUICK_SYNCS_BEFORE_THE_LOOP, SyncPlace


def test_a_slow_sync_sends_commits_to_the_thread_until_enough_quick_ones_in_a_row() -> None:
    place = SyncPlace(0.010)
    assert not place.in_thread
    place.after(0.001)
    assert not place.in_thread
    place.after(0.010)  # slow: the next in the thread
    assert place.in_thread
    for _ in range(QUICK_SYNCS_BEFORE_THE_LOOP - 1):
        place.after(0.001)
    place.after(0.050)  # slow again before enough quick ones: the count starts over
    for _ in range(QUICK_SYNCS_BEFORE_THE_LOOP - 1):
        place.after(0.001)
        assert place.in_thread
    place.after(0.001)
    assert not place.in_thread


def test_a_disk_slow_every_65th_sync_holds_the_loop_up_twice_then_never() -> None:
    """Without backing off, commits would come back to the loop after 64 quick syncs and
    meet the next slow one there: once per 130 commits for ever."""
    place = SyncPlace(0.010)
    slow_on_loop = 0
    for sync in range(10_000):
        slow = sync % 65 == 0
        slow_on_loop += slow and not place.in_thread
        place.after(0.050 if slow else 0.001)
    assert slow_on_loop == 2
    assert place.in_thread and place.quick_needed == 2 * QUICK_SYNCS_BEFORE_THE_LOOP


def test_back_off_grows_with_each_early_slow_sync_and_shrinks_after_a_quick_spell() -> None:
    place = SyncPlace(0.010)
    for expected in (64, 128, 256):
        place.after(0.050)  # slow on the loop
        assert place.in_thread and place.quick_needed == expected
        for _ in range(expected):
            place.after(0.001)
        assert not place.in_thread  # back after that many quick ones in a row
    for _ in range(BACK_OFF_WINDOW * 256):  # a long quick spell on the loop
        place.after(0.001)
    assert not place.in_thread and place.quick_needed == 128
    place.after(0.050)  # slow, but not soon after coming back: no further back-off
    assert place.in_thread and place.quick_needed == 128


def test_no_inline_bound_keeps_every_commit_in_the_thread() -> None:
    place = SyncPlace(0.0)
    for took in (0.0, 0.001, 1.0):
        assert place.in_thread
        place.after(took)
    assert place.in_thread


def test_a_commit_nobody_waits_for_runs_in_the_thread_unless_the_threshold_is_infinite() -> None:
    quick, slow_disk, never = SyncPlace(0.010), SyncPlace(0.010), SyncPlace(math.inf)
    slow_disk.after(0.050)
    never.after(3600.0)  # no sync is slow against an infinite threshold
    assert [quick.in_thread_for(awaited=a) for a in (True, False)] == [False, True]
    assert [slow_disk.in_thread_for(awaited=a) for a in (True, False)] == [True, True]
    assert [never.in_thread_for(awaited=a) for a in (True, False)] == [False, False]
