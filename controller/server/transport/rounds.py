"""A connection's rounds: the requests received so far decided in order, each by the one
answerer of its kind (``answerers.py``), up to a round's room and budget (``decided.py``
holds what a round gives). Run by the connection's task or the poller's round
(``connection.py``), the same either way."""

from __future__ import annotations

import time

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.quorum import Now
from pidctl.controller.server.telemetry.metrics import api_name
from pidctl.controller.server.transport.accounting import Accounting
from pidctl.controller.server.transport.answerers import ANSWERERS, Answerers
from pidctl.controller.server.transport.decided import Answers, Round
from pidctl.protocol.server import (
    AnswerReady,
    ConnectionClosed,
    OversizedRequest,
    Phase,
    ServerConnection,
)


def now() -> Now:
    return Now(time.time_ns() // 1_000_000, time.monotonic_ns() // 1_000_000)


class Rounds:
    """Decides the rounds of every connection (it holds nothing of any one)."""

    def __init__(
        self, controller: Controller, accounting: Accounting, max_entries_per_round: int
    ) -> None:
        self.controller = controller
        self.accounting = accounting
        self.answerers = Answerers(controller, accounting)
        self.max_entries_per_round = max_entries_per_round

    def decide(self, connection: ServerConnection, info: ConnectionInfo, room: int) -> Round:
        """Decide up to ``room`` requests received so far, in order: see :meth:`go_on`."""
        decided = Round(Answers())
        self.go_on(connection, info, room, decided)
        return decided

    def go_on(
        self, connection: ServerConnection, info: ConnectionInfo, room: int, decided: Round
    ) -> None:
        """Decide more requests into ``decided``, until it holds ``room`` answers or has
        spent the round's budget of entries (``max_entries_per_round``: the rest waits for
        the next round, after the other connections'); stop early at a SASL request (left
        for the connection's task, ``ConnectionTasks._authenticate_and_go_on``: the
        exchange awaits), the connection's end, or a throttle. Each kind of request has one
        answerer (``answerers.ANSWERERS``) whatever the settings: a quota or the request log
        only makes the idempotent runs one long."""
        answers, answerers = decided.answers, self.answerers
        budget = self.max_entries_per_round
        one_at_a_time = self.accounting.one_at_a_time
        # The requests of one round are decided at one time (and received at one).
        decided_at: Now | None = None
        received = 0.0
        while len(answers.data) < room and decided.work < budget:
            event = connection.next_event(
                1 if one_at_a_time else min(room - len(answers.data), budget - decided.work)
            )
            answerer = ANSWERERS.get(type(event))
            if answerer is not None:  # (a request is what comes, nearly always)
                if decided_at is None:
                    decided_at, received = now(), time.perf_counter()
                decided.work += answerer(answerers, event, decided_at, info, decided, received)
                if decided.throttle or decided.sasl is not None:
                    # Muted (the rest waits until the throttle time has passed), or a SASL
                    # request for _authenticate_and_go_on (the exchange awaits).
                    return
                continue
            if event is None:
                break
            if isinstance(event, ConnectionClosed):
                decided.closed = event
                return
            decided.work += 1
            if isinstance(event, AnswerReady):
                self.accounting.count("api_versions", event.header.api_version, event.body)
                answers.data.append(connection.send(event.header, event.body))
                continue
            assert isinstance(event, OversizedRequest)
            header = event.header
            body = self.controller.refuse_oversized(header, event.entries, event.limit).body
            self.accounting.count(api_name(header.api_key), header.api_version, body)
            answers.data.append(connection.send(header, body))
        if connection.phase is Phase.CLOSED and not connection.has_pending_requests:
            # Closed (a failed authentication, the client's end) once the round was full:
            # its end is this round's too, or the task would read on a closed connection.
            event = connection.next_event()
            if isinstance(event, ConnectionClosed):
                decided.closed = event
