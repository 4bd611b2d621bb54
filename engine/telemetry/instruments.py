"""What the engine tells a process's metrics: model and tool calls, lease losses, expired
approvals and relayed chunks.

The engine never imports ``workers`` or Prometheus, so it reports to :class:`Instrument`
objects a process installs with :func:`add_instrument` (``workers.metrics`` does, for
``/metrics``). The registry is process-wide and holds its instruments weakly: one that is no
longer referenced stops being called, so tests may build several processes' metrics in one
interpreter. With none installed, each report costs one check.

Every name passed here comes from a definition (an agent's, a model's, a tool's), never from
a request, so the series an instrument keeps per name stay bounded.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

from engine.errors import AgentError, TransientError

__all__ = [
    "CANCELLED",
    "FAILED",
    "TRANSIENT",
    "Instrument",
    "add_instrument",
    "approval_escalated",
    "approval_reminded",
    "approvals_expired",
    "chunks_relayed",
    "error_kind",
    "instruments",
    "lease_lost",
    "model_call",
    "remove_instrument",
    "tool_call",
    "ui_login_failure",
]

#: The kind of a failure worth retrying (a :class:`~engine.errors.TransientError`).
TRANSIENT = "transient"
#: The kind of a failure that is neither transient nor an :class:`~engine.errors.AgentError`.
FAILED = "failed"
#: The kind of a call stopped from outside (an abort, a lost lease, a shutdown).
CANCELLED = "cancelled"


class Instrument(Protocol):
    """Receives the engine's reports; each method must return quickly and never raise."""

    def model_call(self, agent: str, model: str, seconds: float, error_kind: str | None) -> None:
        """A call of ``model`` by ``agent`` took ``seconds``; ``error_kind`` is ``None`` when
        it answered, else how it failed (see :func:`error_kind`)."""

    def tool_call(self, agent: str, tool: str, seconds: float, outcome: str) -> None:
        """A run of ``tool`` by ``agent`` took ``seconds`` and ended ``outcome``: ``done``,
        ``interrupted``, or an error kind (see :func:`error_kind`)."""

    def lease_lost(self, agent: str) -> None:
        """A run of ``agent``'s turn stopped because another worker holds its lease now."""

    def approvals_expired(self, agent: str, count: int) -> None:
        """``count`` approvals of ``agent`` passed their deadline and were decided by expiry."""

    def approval_escalated(self, agent: str) -> None:
        """An approval of ``agent`` stayed open past its timeout and moved to another group."""

    def approval_reminded(self, agent: str) -> None:
        """A reminder about an approval of ``agent`` left open too long was logged."""

    def chunks_relayed(self, count: int, batches: int) -> None:
        """``count`` chunks of running turns left this process in ``batches`` transactions."""

    def webhook_delivery(self, outcome: str) -> None:
        """An attempt at a webhook delivery ended ``outcome``: ``delivered``, ``retried``
        (it failed and will be tried again) or ``failed`` (given up)."""

    def ui_login_failure(self, reason: str) -> None:
        """A sign-in to the inbox UI failed: ``refused`` (the authenticator said no) or
        ``limited`` (too many failures: refused without asking)."""


_refs: tuple[weakref.ref[Instrument], ...] = ()


def add_instrument(instrument: Instrument) -> None:
    """Report to ``instrument`` from now on, until :func:`remove_instrument` or until
    nothing else references it."""
    global _refs
    if instrument not in instruments():
        _refs = (*_refs, weakref.ref(instrument, _forget))


def remove_instrument(instrument: Instrument) -> None:
    """Stop reporting to ``instrument`` (no error when it was not installed)."""
    global _refs
    _refs = tuple(ref for ref in _refs if ref() is not instrument and ref() is not None)


def _forget(dead: weakref.ref[Instrument]) -> None:
    global _refs
    _refs = tuple(ref for ref in _refs if ref is not dead)


def instruments() -> list[Instrument]:
    """The instruments reports go to now."""
    return [instrument for ref in _refs if (instrument := ref()) is not None]


def error_kind(exc: BaseException) -> str:
    """How a call failed, as a bounded label: :data:`CANCELLED`, :data:`TRANSIENT`, an
    :class:`~engine.errors.AgentError`'s Genkit status (``INVALID_ARGUMENT``, ...), or
    :data:`FAILED`."""
    if isinstance(exc, asyncio.CancelledError):
        return CANCELLED
    if isinstance(exc, TransientError):
        return TRANSIENT
    if isinstance(exc, AgentError):
        return exc.status
    return FAILED


def model_call(agent: str, model: str, seconds: float, error_kind: str | None) -> None:
    """Report a model call to every instrument (see :meth:`Instrument.model_call`)."""
    if _refs:
        for instrument in instruments():
            instrument.model_call(agent, model, seconds, error_kind)


def tool_call(agent: str, tool: str, seconds: float, outcome: str) -> None:
    """Report a tool run to every instrument (see :meth:`Instrument.tool_call`)."""
    if _refs:
        for instrument in instruments():
            instrument.tool_call(agent, tool, seconds, outcome)


def lease_lost(agent: str) -> None:
    """Report a lost lease to every instrument (see :meth:`Instrument.lease_lost`)."""
    if _refs:
        for instrument in instruments():
            instrument.lease_lost(agent)


def approvals_expired(agent: str, count: int) -> None:
    """Report expired approvals to every instrument (see
    :meth:`Instrument.approvals_expired`)."""
    if _refs and count:
        for instrument in instruments():
            instrument.approvals_expired(agent, count)


def approval_escalated(agent: str) -> None:
    """Report an escalation to every instrument (see :meth:`Instrument.approval_escalated`)."""
    for instrument in instruments():
        # An instrument written before escalations existed simply does not count them.
        report = getattr(instrument, "approval_escalated", None)
        if report is not None:
            report(agent)


def approval_reminded(agent: str) -> None:
    """Report a reminder to every instrument (see :meth:`Instrument.approval_reminded`)."""
    for instrument in instruments():
        report = getattr(instrument, "approval_reminded", None)
        if report is not None:
            report(agent)


def chunks_relayed(count: int, batches: int) -> None:
    """Report relayed chunks to every instrument (see :meth:`Instrument.chunks_relayed`)."""
    if _refs:
        for instrument in instruments():
            instrument.chunks_relayed(count, batches)


def webhook_delivery(outcome: str) -> None:
    """Report a webhook delivery attempt to every instrument (see
    :meth:`Instrument.webhook_delivery`)."""
    for instrument in instruments():
        # An instrument written before webhooks existed simply does not count them.
        report = getattr(instrument, "webhook_delivery", None)
        if report is not None:
            report(outcome)


def ui_login_failure(reason: str) -> None:
    """Report a failed sign-in to every instrument (see :meth:`Instrument.ui_login_failure`)."""
    if _refs:
        for instrument in instruments():
            instrument.ui_login_failure(reason)
