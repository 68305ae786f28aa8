"""Requests refused without a producer id: counted by API and reason; a used-up range also
fails /readyz and is said, at start-up too (not counted: no request was refused)."""

from __future__ import annotations

from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.state import ControllerState
from pidctl.controller.server.refusals import Refusals
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics


def _refused(metrics: Metrics, api: str, reason: str) -> float:
    labels = {"api": api, "reason": reason}
    value = metrics.registry.get_sample_value("pidctl_producer_id_refusals_total", labels)
    return value or 0.0


def test_refusals_are_counted_and_a_used_up_range_fails_readiness() -> None:
    metrics, faults = Metrics(), dict[str, str]()
    state = ControllerState()
    refusals = Refusals(metrics, state, ProducerIdRange(), Alarm("producer_ids", "x", faults))
    refusals.no_producer_id("InitProducerId", False)  # waiting for a block or a lease
    refusals.paused("AllocateProducerIds")
    assert _refused(metrics, "InitProducerId", "waiting") == 1
    assert _refused(metrics, "AllocateProducerIds", "disk_space") == 1
    assert faults == {}
    refusals.no_producer_id("start-up", True)
    assert "used up" in faults["producer_ids"]
    assert _refused(metrics, "start-up", "exhausted") == 0
    refusals.no_producer_id("AllocateProducerIds", True)
    assert _refused(metrics, "AllocateProducerIds", "exhausted") == 1
