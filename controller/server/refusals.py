"""Requests refused for want of a producer id, or while grants are paused: counted, and a
used-up range said to an operator (the controller's ``on_no_producer_id`` and
``on_paused``)."""

from __future__ import annotations

from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.state import ControllerState
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics


class Refusals:
    """What the controller tells of the requests it refuses without a producer id."""

    def __init__(
        self, metrics: Metrics, state: ControllerState, pid_range: ProducerIdRange, exhausted: Alarm
    ) -> None:
        self.metrics = metrics
        self.state = state
        self.pid_range = pid_range
        self._exhausted = exhausted

    def no_producer_id(self, api: str, exhausted: bool) -> None:
        """A request refused for want of a producer id: counted; a used-up range also
        fails ``/readyz`` and is logged (at once, then at most every 10 s)."""
        if api != "start-up":
            self.metrics.producer_id_refusals.labels(
                api, "exhausted" if exhausted else "waiting"
            ).inc()
        if not exhausted:
            return
        self._exhausted.sound(
            f"the producer id range is used up (no block of 1000 fits below last_producer_id "
            f"{self.pid_range.last}): InitProducerId is answered COORDINATOR_LOAD_IN_PROGRESS "
            "and AllocateProducerIds UNKNOWN_SERVER_ERROR until last_producer_id is raised",
            refused=api,
            next_producer_id=self.state.next_producer_id,
        )

    def paused(self, api: str) -> None:
        """A request refused while grants are paused (a nearly full disk): counted."""
        self.metrics.producer_id_refusals.labels(api, "disk_space").inc()
