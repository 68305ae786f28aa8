"""After a commit, in one place: a grant's audit line and count come with its commit (never
before, nor for a grant whose commit failed), before the answers leave; a storage failure
makes the server not ready at once."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.datadir import StorageFailed
from pidctl.controller.log.durable import DurableOffsets
from pidctl.controller.server.after_commit import AfterCommit
from pidctl.controller.server.telemetry import logs
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.server.transport.outbox import OnSent, SocketWriter, Timings
from pidctl.controller.server.transport.socket_io import SocketIO


@pytest.fixture
def audit() -> Iterator[io.StringIO]:
    out = io.StringIO()
    logs.configure_logging("json", "info", out)
    yield out
    structlog.reset_defaults()


def grant(first: int) -> ProducerIdsGranted:
    return ProducerIdsGranted(1, 1, first, first + 1000, principal="User:b", client_id="c")


def granted(metrics: Metrics) -> float:
    labels = {"holder": "broker", "broker": "1"}
    value = metrics.registry.get_sample_value("pidctl_producer_id_blocks_granted_total", labels)
    return value or 0.0


def after_commit(
    metrics: Metrics, http: HttpEndpoint | None = None, sent: OnSent = lambda size, timings: None
) -> AfterCommit:
    """An after-commit listener whose writer writes for a log durable up to nothing yet."""
    writer = SocketWriter(DurableOffsets(0), sent)
    return AfterCommit(metrics, HttpEndpoint(metrics, 1) if http is None else http, writer)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_grant_has_its_line_and_count_once_its_commit_is_durable(audit: io.StringIO) -> None:
    metrics = Metrics()
    after = after_commit(metrics)
    after.applied(5, grant(0))
    after.applied(6, grant(1000))
    assert granted(metrics) == 0 and lines(audit) == []
    after.committed(6)  # offset 5 durable, 6 not yet
    assert granted(metrics) == 1
    assert [line["first_producer_id"] for line in lines(audit)] == [0]
    after.committed(7)
    assert granted(metrics) == 2
    assert [line["first_producer_id"] for line in lines(audit)] == [0, 1000]
    assert lines(audit)[1]["event"] == "producer ids granted"
    assert lines(audit)[1]["principal"] == "User:b"


def test_the_audit_lines_come_before_the_answers_are_sent(audit: io.StringIO) -> None:
    """An answer held for the grant's commit, written to a real socket: when it is sent,
    the grant's audit line is written already."""
    metrics = Metrics()
    seen: list[tuple[str, int]] = []

    def sent(size: int, timings: Timings) -> None:
        seen.append(("sent", len(lines(audit))))

    after = after_commit(metrics, sent=sent)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        outbox = after.writer.outbox(SocketIO(ours.fileno()))
        after.writer.post(outbox, 0, b"answer", [("allocate_producer_ids", 0.0)])
        assert seen == []  # held for offset 0
        after.applied(0, grant(0))
        after.committed(1)
        assert seen == [("sent", 1)]
        assert theirs.recv(100) == b"answer"


def test_a_storage_failure_makes_the_server_not_ready(tmp_path: Path) -> None:
    metrics = Metrics()
    http = HttpEndpoint(metrics, 1)
    http.ready = True
    after = after_commit(metrics, http)
    after.applied(0, grant(0))
    after.storage_failed(StorageFailed(tmp_path / "0.log", "fdatasync", OSError(5, "EIO")))
    assert not http.ready and granted(metrics) == 0


def test_an_audit_trail_floor_above_its_bytes_is_shown_and_said_not_failed(
    audit: io.StringIO,
) -> None:
    """The floor (log_retention_ms) is kept whatever its size; above log_retention_bytes it
    is a gauge and an error line (once, not per snapshot), and /readyz stays up."""
    metrics = Metrics()
    http = HttpEndpoint(metrics, 1)
    after = after_commit(metrics, http)
    after.audit_trail_kept(500, 1000)
    assert lines(audit) == []
    after.audit_trail_kept(5000, 1000)
    after.audit_trail_kept(6000, 1000)
    said = [
        line for line in lines(audit) if line["event"] == "audit trail above log_retention_bytes"
    ]
    assert len(said) == 1 and said[0]["floor_bytes"] == 5000
    assert metrics.registry.get_sample_value("pidctl_audit_trail_floor_bytes") == 6000
    assert http.faults == {}
    after.audit_trail_kept(10, 1000)  # back under: the next time above is said at once
    after.audit_trail_kept(7000, 1000)
    assert len([line for line in lines(audit) if str(line["event"]).startswith("audit trail")]) == 2
