"""What deciding a connection's requests gives, one round at a time: :class:`Round` (its
answers, and why it stopped early) and :class:`Answers` (the encoded answers and the log
offset they wait for). Made by :class:`~.rounds.Rounds`, filled by the answerers
(``answerers.py``), posted or written by the connection's task (``connection.py``)."""

from __future__ import annotations

from pidctl.controller.api.responses import NO_WAIT
from pidctl.protocol.codec import Request
from pidctl.protocol.server import ConnectionClosed


# Round and Answers: plain classes, one of each made per round (compiled rule 1).
class Round:
    """What deciding the requests received so far gave, and why it stopped early."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.closed: ConnectionClosed | None = None
        self.throttle = 0.0
        #: Entries decided so far (a request without an array counts 1): the round's budget.
        self.work = 0
        #: A SASL request, for the connection's task to answer (the exchange awaits).
        self.sasl: Request | None = None

    @property
    def needs_task(self) -> bool:
        """Whether what comes next needs the connection's own task."""
        return self.closed is not None or self.throttle > 0 or self.sasl is not None


class Answers:
    """Encoded answers of one round, and the log offset they wait for."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.durable_offset = NO_WAIT
        self.timings: list[tuple[str, float]] = []

    def add(self, data: bytes, durable_offset: int, api: str, received: float) -> None:
        self.data.append(data)
        self.durable_offset = max(self.durable_offset, durable_offset)
        self.timings.append((api, received))

    def add_run(self, data: list[bytes], durable_offset: int, api: str, received: float) -> None:
        """:meth:`add` for the answers of one run, all received at one time."""
        self.data += data
        self.durable_offset = max(self.durable_offset, durable_offset)
        self.timings += [(api, received)] * len(data)
