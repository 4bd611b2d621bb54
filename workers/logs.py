"""One log format for a ``turnstile`` process: Turnstile's loggers, uvicorn's and the libraries'.

:func:`configure_logging` installs a single handler on the root logger, writing to stderr in
the ``text`` format (for people) or the ``json`` format (one object a line, for a log
pipeline). Every logger propagates to it — uvicorn's too, when uvicorn is started with
``log_config=None`` — and its :class:`engine.telemetry.log_context.TurnContextFilter` gives each
line logged while a turn runs that turn's ``turn_id``, ``session_id`` and ``agent`` (and
``trace_id`` when tracing records one).

A JSON line carries ``ts`` (UTC, ISO 8601, milliseconds), ``level``, ``logger`` and
``message``, then the turn fields, then any other ``extra=`` attribute of the record, then
``exception`` (the formatted traceback) when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from engine.telemetry.log_context import CONTEXT_FIELDS, TurnContextFilter

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "configure_logging",
]

#: The accepted ``--log-level`` values (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: The accepted ``--log-format`` values.
LOG_FORMATS = ("text", "json")
#: The ``text`` format's line.
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

#: Libraries whose routine lines (a job run every few seconds, a schema check) are kept for
#: ``DEBUG``: at any other level they log warnings and errors only.
_CHATTY_LIBRARIES = ("apscheduler", "alembic")

#: Attributes every record has; anything else on a record came from ``extra=`` or a filter.
_STANDARD_ATTRIBUTES = frozenset(
    {
        *logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__,
        "message",
        "asctime",
        # uvicorn duplicates its message with terminal colour codes under this name.
        "color_message",
    }
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring for its keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        for name, value in record.__dict__.items():
            if name not in _STANDARD_ATTRIBUTES and name not in line:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a line is emitted (a test may swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def configure_logging(level: str, log_format: str = "text") -> logging.Handler:
    """Send every logger's records at ``level`` and above to stderr in ``log_format``.

    Replaces the handler an earlier call installed (and only that one); returns the handler.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    handler = _StderrHandler()
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    handler.addFilter(TurnContextFilter())
    root = logging.getLogger()
    for previous in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(previous)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn's own logging configuration (applied by any server started in this process)
    # gives its loggers handlers and levels and stops them propagating: undo it, so their
    # lines reach this handler, at this level, in this format, and only once.
    for name in _UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
        uvicorn_logger.setLevel(logging.NOTSET)
    quiet = logging.WARNING if root.level > logging.DEBUG else logging.NOTSET
    for name in _CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)
    return handler
