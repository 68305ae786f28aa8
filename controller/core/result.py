"""What every decision returns: KRaft's ControllerResult."""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

from pidctl.controller.core.records import Record

T = TypeVar("T")


class ControllerResult(NamedTuple, Generic[T]):
    """Records to make durable, and the response to give once they are.

    A manager returns it and never appends: the controller replays the records onto the
    managers and hands them to the log, all or none.
    """

    records: tuple[Record, ...]
    response: T


def answer(response: T) -> ControllerResult[T]:
    """A result that writes nothing."""
    return ControllerResult((), response)
