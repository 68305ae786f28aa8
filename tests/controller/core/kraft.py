"""KRaft-style manager tests: decide, replay the result's records, assert."""

from __future__ import annotations

from typing import TypeVar

from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.records import BrokerRegistered, ClusterCreated, Record
from pidctl.controller.core.result import ControllerResult
from pidctl.controller.core.state import ControllerState

T = TypeVar("T")


def new_state(
    *, pid_range: ProducerIdRange | None = None, broker: int | None = None
) -> ControllerState:
    """A state after ClusterCreated("c", 1) (and a registration of ``broker`` at epoch 1)."""
    state = ControllerState().configure(pid_range=pid_range)
    state.replay(0, ClusterCreated("c", 1))
    if broker is not None:
        state.replay(1, BrokerRegistered(broker, "inc", 1))
    return state


def replay(state: ControllerState, *records: Record) -> None:
    for record in records:
        state.replay(state.next_offset, record)


def apply(state: ControllerState, result: ControllerResult[T]) -> T:
    """What the controller does with a result, without a log: replay its records."""
    replay(state, *result.records)
    return result.response
