"""What every decision returns: KRaft's ControllerResult."""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from pidctl.controller.core.records import Record

T = TypeVar("T")


# A plain class built by its own __init__: made per request, and generic (compiled rule 1).
class ControllerResult(Generic[T]):
    """Records to make durable, and the response to give once they are.

    A manager returns it and never appends: the controller replays the records onto the
    managers and hands them to the log, all or none.
    """

    def __init__(self, records: tuple[Record, ...], response: T) -> None:
        self.records: Final = records
        self.response: Final = response


def answer(response: T) -> ControllerResult[T]:
    """A result that writes nothing."""
    return ControllerResult((), response)
