"""Which turn a log line is about: a context variable set while a turn runs, and a logging
filter that copies it onto every record logged meanwhile.

``with turn_context(turn): ...`` marks everything that runs inside — and every task started
inside, since asyncio copies the context into a new task — as work on ``turn``.
:class:`TurnContextFilter`, attached to a handler, gives each record it sees the attributes
``turn_id``, ``session_id`` and ``agent`` of that turn, and ``trace_id`` when
``engine.telemetry.tracing.current_trace_id()`` names one (that module is optional: without it, no
trace id). A formatter then writes them out (``workers/logs.py`` does for ``--log-format
json``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from engine.telemetry import tracing

__all__ = ["CONTEXT_FIELDS", "TurnContextFilter", "TurnFields", "current_turn", "turn_context"]

#: The record attributes :class:`TurnContextFilter` may set, in the order formatters show them.
CONTEXT_FIELDS = ("turn_id", "session_id", "agent", "trace_id")


class _Turn(Protocol):
    """What :func:`turn_context` reads of a turn (a :class:`engine.store.TurnRecord`)."""

    @property
    def id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def agent(self) -> str: ...


@dataclass(frozen=True)
class TurnFields:
    """The identifiers every log line about one turn carries."""

    turn_id: str
    session_id: str
    agent: str


_current: contextvars.ContextVar[TurnFields | None] = contextvars.ContextVar(
    "turnstile_turn", default=None
)


def current_turn() -> TurnFields | None:
    """The turn the running code works on, or ``None`` outside :func:`turn_context`."""
    return _current.get()


@contextlib.contextmanager
def turn_context(turn: _Turn) -> Iterator[TurnFields]:
    """Mark the code run inside the block (and the tasks it starts) as work on ``turn``."""
    fields = TurnFields(turn_id=turn.id, session_id=turn.session_id, agent=turn.agent)
    token = _current.set(fields)
    try:
        yield fields
    finally:
        _current.reset(token)


def current_trace_id() -> str | None:
    """The trace id of the running span or propagated context, if there is one."""
    try:
        return tracing.current_trace_id()
    except Exception:  # a log line must never fail because tracing did
        return None


class TurnContextFilter(logging.Filter):
    """Copies the current turn's fields (and trace id) onto each record; never drops one.

    Attach it to a handler, not a logger: a logger's filters do not see the records its
    children propagate. Attributes a record already has (``extra=``) are left as they are.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields is not None:
            _set_missing(record, "turn_id", fields.turn_id)
            _set_missing(record, "session_id", fields.session_id)
            _set_missing(record, "agent", fields.agent)
        trace_id = current_trace_id()
        if trace_id is not None:
            _set_missing(record, "trace_id", trace_id)
        return True


def _set_missing(record: logging.LogRecord, name: str, value: str) -> None:
    if getattr(record, name, None) is None:
        setattr(record, name, value)
