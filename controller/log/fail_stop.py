"""The metadata log's fail-stop: its first storage failure, told once.

After a failed write or sync (of a segment, a roll, a snapshot, the zeros ahead of the
records, the reservation) nothing more is made durable. The first failure is told to the
log's listener and raised; the log's writer, its snapshots and its preallocation share one
:class:`FailStop`, so that one failure makes one exit status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import structlog

from pidctl.controller.log.datadir import StorageFailed

log: Final = structlog.get_logger("pidctl.metalog")


class FailStop:
    """The log's first storage failure (None while there is none)."""

    def __init__(self, tell: Callable[[StorageFailed], None]) -> None:
        """``tell``: told of the first failure, once (the log listener's ``storage_failed``)."""
        self.failed: StorageFailed | None = None
        self._tell = tell

    def first(self, error: StorageFailed) -> bool:
        """Whether ``error`` is the log's first failure (now told, and to be raised). A
        later one, in another task (a snapshot's, the zeros', the writer's) while the first
        is still on its way out, is only logged: one failure, one exit status (74), not a
        group of them that ends the process as a bug would."""
        if self.failed is None:
            self.failed = error
            self._tell(error)
            return True
        log.warning("storage failed again", error=str(error))
        return False
