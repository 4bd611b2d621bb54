"""How a turn's run ended: what the runner hands the executor to settle the turn with."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import AgentError, TransientError
from engine.model import ModelUsage
from engine.status import FinishReason, TurnStatus
from engine.store import RoundRecord, ToolCallRecord, TurnError

__all__ = ["TurnOutcome", "error_of"]


@dataclass(frozen=True)
class TurnOutcome:
    """How the turn's work ended (the executor turns it into a status transition).

    ``last_round``, ``last_calls`` and ``usage``: the turn's final round, journal rows and
    model usage, not yet written — the executor saves them with the settling transition, in
    one transaction (a turn that completes writes its last round and settles with one
    commit). Only a ``completed`` outcome carries a round; a failed one may carry usage.
    """

    status: TurnStatus
    finish_reason: FinishReason
    error: TurnError | None = None
    transient: bool = False
    last_round: RoundRecord | None = None
    last_calls: tuple[ToolCallRecord, ...] = ()
    #: Token usage of a model call not written yet.
    usage: ModelUsage | None = None


def error_of(exc: BaseException) -> TurnError:
    """The ``{status, message}`` recorded for an exception (never the raw exception)."""
    if isinstance(exc, AgentError):
        return TurnError(status=exc.status, message=exc.message, details=exc.details)
    status = "UNAVAILABLE" if isinstance(exc, TransientError) else "INTERNAL"
    return TurnError(status=status, message=str(exc) or type(exc).__name__)
