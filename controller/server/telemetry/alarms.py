"""Loud signals for what an operator must act on while the server keeps serving (no producer
id left, the disk nearly full): ``/readyz`` fails and names the reason, and a log line says
so at once and then at most every ``interval_s`` however often it happens (the count in
between goes with the next line), until it is cleared."""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

log = structlog.get_logger("pidctl.alarms")

#: Default for an alarm's lines: often enough to be seen in a log, rarely enough that a
#: client retrying every 50 ms does not flood it.
ALARM_LOG_INTERVAL_S = 10.0


class Alarm:
    """One condition: :meth:`sound` each time it is met, :meth:`clear` once it is gone.

    ``faults`` is the HTTP endpoint's map of reasons ``/readyz`` fails for; the alarm's
    ``name`` is its key there."""

    def __init__(
        self,
        name: str,
        event: str,
        faults: MutableMapping[str, str],
        *,
        interval_s: float = ALARM_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.event = event
        self.interval_s = interval_s
        self._faults = faults
        self._clock = clock
        self._logged_at: float | None = None
        self._reason: str | None = None
        #: Times sounded since the last line.
        self.unlogged = 0

    @property
    def active(self) -> bool:
        return self._reason is not None

    def sound(self, reason: str, **fields: Any) -> bool:
        """The condition is met (again): ``/readyz`` fails with ``reason``; logged at once
        when new or changed, else at most every ``interval_s``. True if a line was written."""
        moment = self._clock()
        self.unlogged += 1
        changed = reason != self._reason
        self._reason = reason
        self._faults[self.name] = reason
        due = self._logged_at is None or moment - self._logged_at >= self.interval_s
        if not (changed or due):
            return False
        log.error(self.event, reason=reason, times=self.unlogged, **fields)
        self._logged_at, self.unlogged = moment, 0
        return True

    def clear(self, **fields: Any) -> None:
        """The condition is gone: ``/readyz`` no longer fails for it (logged once)."""
        if self._reason is None:
            return
        self._faults.pop(self.name, None)
        log.warning(f"{self.event}: over", **fields)
        self._reason, self._logged_at, self.unlogged = None, None, 0
