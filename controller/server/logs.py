"""structlog set-up: JSON lines by default, a readable console format for a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

#: Log lines that could not be written (a closed pipe, a full disk under the container's
#: log): counted, exported as pidctl_log_write_failures_total, and otherwise ignored. The
#: metadata log is what must not fail; stdout and stderr may.
write_failures = 0


def log_write_failures() -> int:
    """Log lines dropped so far because they could not be written."""
    return write_failures


class _SafePrintLogger(structlog.PrintLogger):
    """structlog's PrintLogger, but a line it cannot write is dropped and counted."""

    def msg(self, message: str) -> None:
        global write_failures
        try:
            super().msg(message)
        except (OSError, ValueError):  # EPIPE, ENOSPC, EIO; ValueError: a closed file
            write_failures += 1

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _SafePrintLoggerFactory:
    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _SafePrintLogger:
        return _SafePrintLogger(self._file)


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    renderer: structlog.typing.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
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
        logger_factory=_SafePrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
