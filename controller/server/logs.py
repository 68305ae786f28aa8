"""structlog set-up: JSON lines by default, a readable console format for a terminal.

Each line is written at once, except inside :func:`one_write`: the lines a thread logs in
that block go out together in one write when it ends (the grant lines of one group commit,
so that a busy log pipe costs one system call per commit, not one per grant).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import structlog

#: Log lines that could not be written (a closed pipe, a full disk under the container's
#: log): counted, exported as pidctl_log_write_failures_total, and otherwise ignored. The
#: metadata log is what must not fail; stdout and stderr may.
write_failures = 0

#: One encoder for every JSON line: structlog's default serializer (``json.dumps`` with a
#: ``default``) builds a new encoder per line. ``repr`` for anything JSON cannot hold, as
#: structlog's fallback does for objects without ``__structlog__`` (pidctl logs none).
_JSON = json.JSONEncoder(default=repr)

_held = threading.local()


def log_write_failures() -> int:
    """Log lines dropped so far because they could not be written."""
    return write_failures


@contextmanager
def one_write() -> Iterator[None]:
    """Hold the lines this thread logs inside the block and write them, in order, with one
    write when it ends."""
    lines: list[str] = []
    outer = getattr(_held, "lines", None)
    _held.lines = lines
    try:
        yield
    finally:
        _held.lines = outer
        if lines and _writer is not None:
            _writer.write_all(lines)


class _LineWriter:
    """A structlog logger writing each rendered line to a text file and flushing it; a line
    it cannot write is dropped and counted."""

    _lock = threading.Lock()

    def __init__(self, file: TextIO) -> None:
        self.file = file

    def msg(self, message: str) -> None:
        held: list[str] | None = getattr(_held, "lines", None)
        if held is not None:
            held.append(message)
        else:
            self.write_all([message])

    def write_all(self, lines: list[str]) -> None:
        global write_failures
        text = "\n".join(lines) + "\n"
        with self._lock:
            try:
                self.file.write(text)
                self.file.flush()
            except (OSError, ValueError):  # EPIPE, ENOSPC, EIO; ValueError: a closed file
                write_failures += len(lines)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_writer: _LineWriter | None = None


def _logger_factory(*args: Any) -> _LineWriter:
    assert _writer is not None
    return _writer


def configure_logging(fmt: str = "json", level: str = "info", file: TextIO | None = None) -> None:
    """Log to ``file`` (standard error by default) in ``fmt`` (``json`` or ``console``), at
    ``level`` and above."""
    global _writer
    _writer = _LineWriter(sys.stderr if file is None else file)
    renderer: structlog.typing.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=_writer.file.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_json_line)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=True,
    )


def _json_line(event: Any, **_: Any) -> str:
    return _JSON.encode(event)
