"""Loud signals for what an operator must act on while the server keeps serving (no producer
id left, the disk nearly full): ``/readyz`` fails and names the reason, and a log line says
so at once and then at most every ``interval_s`` however often it happens (the count in
between goes with the next line), until it is cleared. :class:`ThrottledLine` is that log
line alone, for what happens often at a client's will (a connection refused) and must not
flood the log."""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any, Final

import structlog

log: Final = structlog.get_logger("pidctl.alarms")

#: Default for an alarm's lines: often enough to be seen in a log, rarely enough that a
#: client retrying every 50 ms does not flood it.
ALARM_LOG_INTERVAL_S: Final = 10.0


class ThrottledLine:
    """When a line about something that keeps happening is due: at once the first time (and
    whenever its reason changes), then at most every ``interval_s``; :meth:`due` says how
    many times it happened since the last line, which the line should carry."""

    def __init__(
        self,
        interval_s: float = ALARM_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._logged_at: float | None = None
        self._reason: str | None = None
        #: Times counted since the last line.
        self.unlogged = 0

    def due(self, reason: str) -> int:
        """Count one more time (for ``reason``); how many times the line written now must
        say, or 0 if none is due."""
        moment = self._clock()
        self.unlogged += 1
        changed = reason != self._reason
        self._reason = reason
        recent = self._logged_at is not None and moment - self._logged_at < self.interval_s
        if recent and not changed:
            return 0
        times, self._logged_at, self.unlogged = self.unlogged, moment, 0
        return times

    def reset(self) -> None:
        """Start again: the next time is logged at once."""
        self._reason, self._logged_at, self.unlogged = None, None, 0


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
        self._faults = faults
        self._line = ThrottledLine(interval_s, clock)
        self._reason: str | None = None

    @property
    def active(self) -> bool:
        return self._reason is not None

    def sound(self, reason: str, **fields: Any) -> bool:
        """The condition is met (again): ``/readyz`` fails with ``reason``; logged at once
        when new or changed, else at most every ``interval_s``. True if a line was written."""
        self._reason = reason
        self._faults[self.name] = reason
        times = self._line.due(reason)
        if not times:
            return False
        log.error(self.event, reason=reason, times=times, **fields)
        return True

    def clear(self, **fields: Any) -> None:
        """The condition is gone: ``/readyz`` no longer fails for it (logged once)."""
        if self._reason is None:
            return
        self._faults.pop(self.name, None)
        log.warning(f"{self.event}: over", **fields)
        self._reason = None
        self._line.reset()
