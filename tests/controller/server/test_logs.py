"""The log lines: JSON by default, written at once, or together inside ``one_write``; a line
that cannot be written is counted, never raised."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest
import structlog

from pidctl.controller.server import logs


class _CountingFile(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


class _BrokenFile(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(32, "Broken pipe")


@pytest.fixture
def configured() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _lines(file: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in file.getvalue().splitlines()]


def test_each_line_is_written_at_once_as_json(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "info", out)
    log = structlog.get_logger("t")
    log.info("producer ids granted", broker_id=1, first_producer_id=0, principal=None)
    log.debug("not at info")
    assert out.writes == 1
    [line] = _lines(out)
    assert line["event"] == "producer ids granted" and line["level"] == "info"
    assert (line["broker_id"], line["principal"]) == (1, None)
    assert str(line["timestamp"]).endswith("Z")


def test_lines_inside_one_write_go_out_together_in_order(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "info", out)
    log = structlog.get_logger("t")
    with logs.one_write():
        for n in range(5):
            log.info("granted", n=n)
        assert out.writes == 0
    assert out.writes == 1
    assert [line["n"] for line in _lines(out)] == [0, 1, 2, 3, 4]
    log.info("after")
    assert out.writes == 2


def test_one_write_holds_only_its_own_threads_lines(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "info", out)
    log = structlog.get_logger("t")
    with logs.one_write():
        log.info("held")
        other = threading.Thread(target=lambda: log.info("from another thread"))
        other.start()
        other.join()
        assert [line["event"] for line in _lines(out)] == ["from another thread"]
    assert [line["event"] for line in _lines(out)] == ["from another thread", "held"]


def test_lines_that_cannot_be_written_are_counted(configured: None) -> None:
    logs.configure_logging("json", "info", _BrokenFile())
    log = structlog.get_logger("t")
    before = logs.log_write_failures()
    log.info("one")
    with logs.one_write():
        log.info("two")
        log.info("three")
    assert logs.log_write_failures() == before + 3


def test_values_json_cannot_hold_are_written_as_their_repr(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "info", out)
    structlog.get_logger("t").info("odd", value={1, 2}.__class__)
    assert _lines(out)[0]["value"] == "<class 'set'>"
