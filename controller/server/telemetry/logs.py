"""structlog set-up: a readable console format on a terminal, JSON lines otherwise.

Each line is written at once. :func:`log_each` writes the lines of one moment (the grants one
group commit made durable) together: one timestamp, one write, and rendered directly rather
than through structlog's processor chain line by line.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

import structlog

from pidctl.controller.core.json_encoding import json_encoder, object_encoder

#: Log lines that could not be written (a closed pipe, a full disk under the container's
#: log): counted, exported as pidctl_log_write_failures_total, and otherwise ignored. The
#: metadata log is what must not fail; stdout and stderr may.
write_failures = 0

#: Every JSON line, through one encoder built once (structlog's default serializer builds
#: one per line). ``repr`` for anything JSON cannot hold, as structlog's fallback does for
#: objects without ``__structlog__`` (pidctl logs none).
_json_line = json_encoder(default=repr)


def _json_serialize(event: Any, **_: Any) -> str:
    return _json_line(event)


_Render = Callable[[Any, str, dict[str, Any]], str]

#: The timestamp of every line, from the processor chain and from :func:`log_each` alike.
_stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)


def log_write_failures() -> int:
    """Log lines dropped so far because they could not be written."""
    return write_failures


def log_each(event: str, fields: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> None:
    """Log ``event`` at info once per row, as ``log.info(event, **dict(zip(names, row)))``
    would (the row's fields first), but with one timestamp for all and one write.
    ``fields`` are the rows' (name, annotated type) pairs, in their order.

    The lines are rendered here, skipping what the processor chain adds per line (a context
    merge, the level, a timestamp each): for the audit trail's grant lines that chain cost
    ten times the rendering. JSON lines come from a template built once per set of fields
    (:func:`~pidctl.controller.core.json_encoding.object_encoder`), the console's through
    its renderer."""
    if _writer is None or not rows or _min_level > logging.INFO:
        return
    stamp = _stamp(None, "info", {})["timestamp"]
    if _json_lines:
        encode = _line_encoder(tuple(fields))
        lines = [encode((*row, event, "info", stamp)) for row in rows]
    else:
        names = [name for name, _ in fields]
        common = {"event": event, "level": "info", "timestamp": stamp}
        render = _renderer
        lines = [
            render(None, "info", {**dict(zip(names, row, strict=True)), **common}) for row in rows
        ]
    _writer.write_all(lines)


@functools.cache
def _line_encoder(fields: tuple[tuple[str, str], ...]) -> Callable[[Sequence[Any]], str]:
    """A JSON line of these fields and then the event, level and timestamp, as the JSON
    renderer writes it (``repr`` for what JSON cannot hold)."""
    line = (*fields, ("event", "str"), ("level", "str"), ("timestamp", "str"))
    return object_encoder(line, default=repr)


class _LineWriter:
    """A structlog logger writing each rendered line to a text file and flushing it; a line
    it cannot write is dropped and counted."""

    _lock = threading.Lock()

    def __init__(self, file: TextIO) -> None:
        self.file = file

    def msg(self, message: str) -> None:
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
#: The configured renderer (JSON or console), which gives every line as text.
_renderer: _Render = cast(_Render, structlog.processors.JSONRenderer(serializer=_json_serialize))
_min_level = logging.INFO
#: Whether lines are JSON (the default), which :func:`log_each` writes from a template.
_json_lines = True


def _logger_factory(*args: Any) -> _LineWriter:
    assert _writer is not None
    return _writer


def configure_logging(
    fmt: str = "json", level: str = "info", file: TextIO | None = None, *, cache: bool = True
) -> None:
    """Log to ``file`` (standard error by default) in ``fmt`` (``json``, ``console``, or
    ``auto``: console on a terminal, JSON otherwise), at ``level`` and above. ``cache``:
    each module's logger keeps this configuration from its first line on (the server's);
    False for a configuration that is undone afterwards (a benchmark run in a test's
    process), which a cached logger would keep."""
    global _writer, _renderer, _min_level, _json_lines
    _writer = _LineWriter(sys.stderr if file is None else file)
    if fmt == "auto":
        fmt = "console" if _writer.file.isatty() else "json"
    renderer: structlog.typing.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=_writer.file.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_json_serialize)
    _renderer = cast(_Render, renderer)
    _json_lines = fmt != "console"
    _min_level = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_min_level),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=cache,
    )


def reset_logging() -> None:
    """Undo :func:`configure_logging`: structlog's defaults, and JSON lines at ``info`` for
    :func:`log_each` (what a benchmark run in a test's process leaves behind)."""
    global _writer, _renderer, _min_level, _json_lines
    _writer = None
    _renderer = cast(_Render, structlog.processors.JSONRenderer(serializer=_json_serialize))
    _min_level, _json_lines = logging.INFO, True
    structlog.reset_defaults()
