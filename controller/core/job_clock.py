"""The two clocks of job allocations, each wrong only on its safe side (pure: the wall and
monotonic milliseconds are passed in).

A named job version is answered its blocks again only while the brokers still know its PIDs'
sequences (``job_allocation_reuse_ms``), and forgotten only long after
(``job_allocation_expiration_ms``). Both are ages, and a wall clock stepped either way gets
ages wrong. What is safe differs:

- **Job time** (the reuse window) must never count less than really passed: counting less
  answers a re-run whose PIDs the brokers forgot, and it writes twice; counting more only
  refuses a re-run too soon. Job time is the wall clock, but never behind the monotonic
  clock's count since the controller started (``max``): a clock set back while the
  controller runs changes nothing, a clock set ahead makes versions older (refused sooner)
  only while it is ahead. A version is stamped with the job time of its first block
  (``JobBlockRecorded.allocated_ms``); a version whose stamp is ahead of job time (stamped
  while the clock was ahead, or the clock is now behind) has an unknown age and is refused.
- **Running time** (expiry) must never count more than really passed: counting more forgets
  a version while a re-run may still come, which then gets other blocks. Running time is the
  monotonic clock's count, carried from one process to the next in the log (each job record
  and :class:`~pidctl.controller.core.records.JobClockAdvanced` holds it); a restart goes on
  from the newest running time recorded, so the time the controller was down, and a wall
  clock stepped either way, never count. Running stamps grow in log order, so the versions
  in that order are in the order they expire.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class JobClock:
    """Job time and running time of one process, from the clocks read at each decision.

    Anchored once (:meth:`anchor`, at start-up; else at the first reading, as in tests):
    the wall and monotonic milliseconds then, and the running time to go on from.
    """

    anchored: bool = False
    wall_anchor_ms: int = 0
    mono_anchor_ms: int = 0
    running_anchor_ms: int = 0

    def anchor(self, wall_ms: int, mono_ms: int, running_ms: int) -> None:
        """Start counting: job time from ``wall_ms``, running time from ``running_ms``, both
        at ``mono_ms``."""
        self.anchored = True
        self.wall_anchor_ms = wall_ms
        self.mono_anchor_ms = mono_ms
        self.running_anchor_ms = running_ms

    def job_ms(self, wall_ms: int, mono_ms: int) -> int:
        """The wall clock, never behind the monotonic clock's count since the anchor."""
        if not self.anchored:
            self.anchor(wall_ms, mono_ms, wall_ms)
        return max(wall_ms, self.wall_anchor_ms + (mono_ms - self.mono_anchor_ms))

    def running_ms(self, wall_ms: int, mono_ms: int) -> int:
        """The running time: the anchor's, plus the monotonic clock's count since."""
        if not self.anchored:
            self.anchor(wall_ms, mono_ms, wall_ms)
        return self.running_anchor_ms + max(0, mono_ms - self.mono_anchor_ms)
