"""The log lines: JSON by default, each written at once, or the lines of one moment together
through ``log_each`` (rendered as structlog would); a line that cannot be written is counted,
never raised."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator

import pytest
import structlog

from pidctl.controller.server.telemetry import logs


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


_FIELDS = (
    ("holder", "str"),
    ("broker_id", "int"),
    ("first_producer_id", "int"),
    ("principal", "str | None"),
    ("listeners", "tuple[str, ...]"),
)
_GRANTS = [
    ("broker", 1, 0, None, ()),
    ("job", -1, 1000, "User:é", ("PLAINTEXT://h:1",)),
    ('br"ok\\er', 2, 2**64, "User:b", ("a", "b")),
]
_NAMES = [name for name, _ in _FIELDS]


def _without_timestamp(text: str, fmt: str) -> list[str]:
    if fmt == "json":  # the text itself, byte for byte, but for the time
        return [re.sub(r'"timestamp": "[^"]*"', "-", line) for line in text.splitlines()]
    return [line.partition(" ")[2] for line in text.splitlines()]  # console: time first


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_log_each_renders_each_row_as_log_info_would(configured: None, fmt: str) -> None:
    each, one_by_one = _CountingFile(), _CountingFile()
    logs.configure_logging(fmt, "info", one_by_one)
    for row in _GRANTS:
        structlog.get_logger("t").info(
            "producer ids granted", **dict(zip(_NAMES, row, strict=True))
        )
    structlog.reset_defaults()
    logs.configure_logging(fmt, "info", each)
    logs.log_each("producer ids granted", _FIELDS, _GRANTS)
    assert each.writes == 1 and one_by_one.writes == 3
    assert _without_timestamp(each.getvalue(), fmt) == _without_timestamp(
        one_by_one.getvalue(), fmt
    )
    if fmt == "json":
        lines = _lines(each)
        assert list(lines[0]) == [*_NAMES, "event", "level", "timestamp"]
        assert len({line["timestamp"] for line in lines}) == 1
        assert str(lines[0]["timestamp"]).endswith("Z")


def test_log_each_respects_the_level(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "warning", out)
    logs.log_each("producer ids granted", _FIELDS, _GRANTS)
    logs.log_each("nothing", _FIELDS, [])
    assert out.writes == 0


def test_lines_that_cannot_be_written_are_counted(configured: None) -> None:
    logs.configure_logging("json", "info", _BrokenFile())
    log = structlog.get_logger("t")
    before = logs.log_write_failures()
    log.info("one")
    logs.log_each("two", [("n", "int")], [(2,), (3,)])
    assert logs.log_write_failures() == before + 3


def test_values_json_cannot_hold_are_written_as_their_repr(configured: None) -> None:
    out = _CountingFile()
    logs.configure_logging("json", "info", out)
    structlog.get_logger("t").info("odd", value={1, 2}.__class__)
    assert _lines(out)[0]["value"] == "<class 'set'>"


def test_auto_is_readable_on_a_terminal_and_json_otherwise(configured: None) -> None:
    """``log_format = "auto"`` (the default): a terminal (a real pseudo-terminal here) gets
    structlog's console lines, a pipe or a file gets JSON."""
    import os
    import pty

    leader, follower = pty.openpty()
    terminal = os.fdopen(follower, "w")
    try:
        logs.configure_logging("auto", "info", terminal)
        structlog.get_logger("t").info("pidctl starting", version="1.2.3")
        seen = os.read(leader, 4096).decode()
    finally:
        terminal.close()
        os.close(leader)
    assert "pidctl starting" in seen and "version" in seen and "1.2.3" in seen
    assert not seen.lstrip().startswith("{")
    out = io.StringIO()
    logs.configure_logging("auto", "info", out)
    structlog.get_logger("t").info("pidctl starting", version="1.2.3")
    assert _lines(out)[0]["event"] == "pidctl starting"
