"""What happens once a commit is on disk, owned in one place.

Kafka's metadata publishers are the model: they only ever see what is persisted. The log
tells :class:`AfterCommit`, and nothing else, what it has done (:class:`CommitListener`);
after each commit it writes the audit line of every grant now durable and counts it, then
has the writer send every answer the purgatory now releases, in that order: an answered grant always
has its line, whatever happens next. A grant lost to a crash before its commit was never
answered, and is neither in the audit trail nor counted.
"""

from __future__ import annotations

import collections
import operator
from typing import Final

import structlog

from pidctl.controller.core.records import ProducerIdsGranted, Record
from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.metalog import CommitListener
from pidctl.controller.server.telemetry.alarms import ThrottledLine
from pidctl.controller.server.telemetry.logs import log_each
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.server.transport.outbox import SocketWriter

log: Final = structlog.get_logger("pidctl.server")

#: A grant's audit line: attributes of its record, with their types.
GRANT_FIELDS: Final = (
    ("holder", "str"),
    ("broker_id", "int"),
    ("broker_epoch", "int"),
    ("first_producer_id", "int"),
    ("last_producer_id", "int"),
    ("principal", "str | None"),
    ("client_id", "str | None"),
)
#: A grant record's values of :data:`GRANT_FIELDS`, in their order.
_grant_values: Final = operator.attrgetter(*(name for name, _ in GRANT_FIELDS))


class AfterCommit(CommitListener):
    """The audit lines, the answers and the log's metrics, after each commit; and the
    storage failure that ends them (``/readyz`` fails at once, one event says what)."""

    def __init__(self, metrics: Metrics, http: HttpEndpoint, writer: SocketWriter) -> None:
        """``writer``: the plain connections' writer, which writes what the purgatory
        releases after each commit."""
        self.metrics = metrics
        self.http = http
        self.writer: Final[SocketWriter] = writer
        #: The audit trail above log_retention_bytes within log_retention_ms: said at once,
        #: then at most every ten minutes while it lasts.
        self._trail_over = ThrottledLine(600.0)
        # Grants applied, by offset, whose audit line waits until they are durable.
        self._grants_not_durable: collections.deque[tuple[int, ProducerIdsGranted]] = (
            collections.deque()
        )

    def applied(self, offset: int, record: Record) -> None:
        """A controller observer: a grant waits here until its commit."""
        if isinstance(record, ProducerIdsGranted):
            self._grants_not_durable.append((offset, record))

    def batch_written(self, records: int, size: int, seconds: float, in_thread: bool) -> None:
        self.metrics.log_batch(records, size, seconds, in_thread)

    def committed(self, durable_end: int) -> None:
        pending = self._grants_not_durable
        if pending and pending[0][0] < durable_end:
            granted, grants = self.metrics.granted, []
            while pending and pending[0][0] < durable_end:
                grant = pending.popleft()[1]
                granted(
                    grant.holder, grant.broker_id, grant.next_producer_id - grant.first_producer_id
                )
                grants.append(_grant_values(grant))
            log_each("producer ids granted", GRANT_FIELDS, grants)  # one commit's lines together
        self.writer.release(durable_end)

    def snapshot_written(self, size: int) -> None:
        self.metrics.snapshot_written(size)

    def audit_trail_kept(self, floor_bytes: int, retention_bytes: int) -> None:
        """The floor of the audit trail (``log_retention_ms``) is kept whatever its size; a
        floor above ``log_retention_bytes`` is shown and said (the log grows faster than the
        settings planned for: raise the bytes, lower the time, or look for who writes)."""
        self.metrics.audit_trail_floor_bytes.set(floor_bytes)
        if floor_bytes <= retention_bytes:
            self._trail_over.reset()
            return
        times = self._trail_over.due("over")
        if times:
            log.error(
                "audit trail above log_retention_bytes",
                floor_bytes=floor_bytes,
                log_retention_bytes=retention_bytes,
                note="segments younger than log_retention_ms are kept whatever their size",
                times=times,
            )

    def storage_failed(self, error: StorageFailed) -> None:
        storage_failed(self.http, error)


def storage_failed(http: HttpEndpoint, error: StorageFailed) -> None:
    """Fail-stop: not ready any more, one event saying what failed; the error then ends
    the process (exit status ``StorageFailed.exit_code``, 74). (Start-up's recovery says
    so the same way, before there is a log to tell :class:`AfterCommit`.)"""
    http.ready = False
    log.error(
        "storage_failed",
        file=str(error.path),
        operation=error.operation,
        errno=error.errno,
        error=error.errno_name,
    )
