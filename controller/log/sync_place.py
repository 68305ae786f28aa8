"""Where a group commit's ``write`` and ``fdatasync`` run, and why (said here only).

On the event loop itself while the disk syncs quickly: handing a commit to a thread and back
costs more than a quick sync (the thread must be woken on another core and win the GIL from a
busy loop, and the loop woken in turn: about 1.5 ms per commit under load, where the disk
takes 0.2-0.4 ms, and more of the loop's time per request than the sync itself). In the log's
own thread (``disk_thread.py``) after a slow sync: there a slow disk holds up only the
answers waiting for it, and the loop goes on serving everything else (ApiVersions, Metadata,
InitProducerId from a durable block, /healthz), held up by one slow sync at a time, and
rarely. A commit nobody waits for (a prefetched block's grant: the answers of the block
before it do not wait for it) runs in the thread however quick the disk: the hand-over then
makes nobody later, and no sync of it holds the loop up, not even the disk's occasional slow
one (212 ms here). :class:`SyncPlace` decides; the log's writer (``metalog.py``) obeys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

#: Default for ``inline_sync_max_s``. A local disk syncs a commit in well under a millisecond
#: (p99 0.4 ms on the development machine); a network volume or a failing disk takes longer.
DEFAULT_INLINE_SYNC_MAX_S: Final = 0.010


#: After a slow sync, commits stay in the log's thread until this many in a row there were
#: quick: a disk slow now and then (one sync in five, say) keeps them in the thread, rather
#: than holding the loop up for every other slow sync.
QUICK_SYNCS_BEFORE_THE_LOOP: Final = 64


#: A slow sync on the loop within this many times the quick syncs needed (since commits came
#: back to the loop) doubles them: the disk is slow now and then, not once.
BACK_OFF_WINDOW: Final = 8


#: The most quick syncs in a row the thread waits for (a disk slow once in this many
#: commits holds the loop up once in as many).
MAX_QUICK_SYNCS_BEFORE_THE_LOOP: Final = 64 * 1024


@dataclass(slots=True)
class SyncPlace:
    """Where the next commit's ``write`` and ``fdatasync`` run: on the event loop while they
    take less than ``max_s``; after a slower one in the log's thread, until ``quick_needed``
    in a row there were quick (``QUICK_SYNCS_BEFORE_THE_LOOP`` at first). ``max_s`` 0:
    always in the thread.

    A slow sync on the loop soon after coming back (within ``BACK_OFF_WINDOW`` times
    ``quick_needed`` quick syncs there) doubles ``quick_needed``, up to
    ``MAX_QUICK_SYNCS_BEFORE_THE_LOOP``: a disk slow about every 65th sync would otherwise
    hold the loop up once per 130 commits for ever; now it holds it up twice, then commits
    stay in the thread. A whole window of quick syncs on the loop halves it again."""

    max_s: float
    in_thread: bool = field(init=False)
    quick_in_thread: int = field(default=0, init=False)
    quick_needed: int = field(default=QUICK_SYNCS_BEFORE_THE_LOOP, init=False)
    #: Quick syncs on the loop since commits came back to it from the thread, while that
    #: is recent (None: not recently).
    quick_since_back: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.in_thread = self.max_s <= 0

    def in_thread_for(self, awaited: bool) -> bool:
        """Where the next commit runs: in the thread when :attr:`in_thread` says so, or
        when nobody waits for it (not ``awaited``); with ``max_s`` infinite, always on the
        loop (tests under trio's mock clock, which would jump while the thread works)."""
        return self.in_thread or (not awaited and self.max_s != math.inf)

    def after(self, took: float) -> None:
        """The commit just made (where ``in_thread`` said) took ``took`` seconds."""
        slow = self.max_s <= 0 or took >= self.max_s
        if not self.in_thread:
            self._after_on_loop(slow)
            return
        self.quick_in_thread = 0 if slow else self.quick_in_thread + 1
        if self.quick_in_thread >= self.quick_needed:
            self.in_thread, self.quick_since_back = False, 0

    def _after_on_loop(self, slow: bool) -> None:
        back = self.quick_since_back
        if slow:
            if back is not None:  # slow again soon after coming back: back off further
                self.quick_needed = min(2 * self.quick_needed, MAX_QUICK_SYNCS_BEFORE_THE_LOOP)
            self.in_thread, self.quick_in_thread, self.quick_since_back = True, 0, None
        elif back is not None:
            back += 1
            if back >= BACK_OFF_WINDOW * self.quick_needed:
                self.quick_needed = max(QUICK_SYNCS_BEFORE_THE_LOOP, self.quick_needed // 2)
                back = None
            self.quick_since_back = back
