"""The exception hierarchy of Turnstile.

Every error a caller can act on is an :class:`AgentError` carrying a Genkit status name
(``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ...), so the HTTP layer can map it to a 4xx
code and a remote client can rebuild the same typed error. Store-level race outcomes
(:class:`StaleTransitionError`, :class:`LeaseLostError`) are separate: they mean "somebody
else owns this turn now", which the executor handles rather than the user.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AgentError",
    "ApprovalNotPendingError",
    "DecisionConflictError",
    "DefinitionChangedError",
    "FailedPreconditionError",
    "InsecureKeyError",
    "InvalidArgumentError",
    "InvalidStateError",
    "LeaseLostError",
    "NoWorkerError",
    "NotFoundError",
    "ResumeValidationError",
    "SessionBusyError",
    "SessionMismatchError",
    "SnapshotNotResumableError",
    "StaleSnapshotError",
    "StaleTransitionError",
    "StoreError",
    "TooManyTurnsError",
    "ToolError",
    "TransientError",
    "TurnFailedError",
    "TurnTimeoutError",
    "TurnstileError",
]


class TurnstileError(Exception):
    """Root of every exception Turnstile raises on purpose."""


class AgentError(TurnstileError):
    """An error with a Genkit status name, safe to show to the caller.

    ``status`` follows Genkit's (gRPC-style) status names; ``snapshot_id`` points at the
    snapshot the caller can continue from, when there is one.

    ``response``: the failed output Genkit answers the request with, when the error is one
    (:class:`~engine.response.AgentResponse` with ``finish_reason`` ``failed`` and this error
    as ``error``): a turn that failed (:class:`TurnFailedError`), or a send or resume refused
    before its turn existed, which changed nothing. ``None`` for what Genkit throws instead
    (API misuse, :class:`SessionMismatchError`) and for errors outside a turn.
    """

    default_status: ClassVar[str] = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        status: str | None = None,
        details: Any = None,
        snapshot_id: str | None = None,
        response: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status or self.default_status
        self.details = details
        self.snapshot_id = snapshot_id
        self.response = response

    def to_wire(self) -> dict[str, Any]:
        """The ``{status, message, details?}`` object Genkit puts in ``AgentOutput.error``."""
        wire: dict[str, Any] = {"status": self.status, "message": self.message}
        if self.details is not None:
            wire["details"] = self.details
        return wire

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


class InvalidArgumentError(AgentError):
    """The request itself is malformed or does not match what it refers to."""

    default_status = "INVALID_ARGUMENT"


class SessionMismatchError(InvalidArgumentError):
    """A request names a snapshot together with a session it does not belong to. API misuse:
    raised as it is (Genkit throws it), never answered as a failed output."""


class FailedPreconditionError(AgentError):
    """The request is well-formed but the system is not in a state that allows it."""

    default_status = "FAILED_PRECONDITION"


class NotFoundError(AgentError):
    """A snapshot, session, agent or tool that the request names does not exist."""

    default_status = "NOT_FOUND"


class DefinitionChangedError(FailedPreconditionError):
    """A paused turn's agent definition changed since it paused and no registered migration
    covers its version: resuming it is refused, nothing written (:mod:`engine.state.pinning`).
    ``details`` is ``{"fromVersion", "toVersion", "changes": [{"what", "change", "before",
    "after"}]}``."""


class ResumeValidationError(InvalidArgumentError):
    """A resume entry does not match the pending interrupts of the snapshot it resumes.

    Raised before anything is written: the paused snapshot stays resumable.
    """


class SnapshotNotResumableError(FailedPreconditionError):
    """The snapshot is ``pending`` or ``aborting`` (or paused and the request is not a resume)."""


class SessionBusyError(AgentError):
    """Another turn of the same session is still running: one turn at a time per session."""

    default_status = "ABORTED"


class StaleSnapshotError(AgentError):
    """The snapshot a new turn would continue is no longer its session's latest: another
    send or resume continued the session first. Retryable: continue from the latest
    snapshot (``snapshot_id``), never from the stale one, so no message is lost."""

    default_status = "ABORTED"


class ApprovalNotPendingError(AgentError):
    """An interrupt was already answered (or is no longer pending): it can be decided once."""

    default_status = "ABORTED"


class DecisionConflictError(ApprovalNotPendingError):
    """An interrupt already has a recorded decision and the request answers it differently:
    a recorded answer is final, whichever path (chat resume, remote resume, inbox) tries
    to change it."""


class InvalidStateError(InvalidArgumentError):
    """A client-managed state blob is malformed, tampered with, expired or foreign."""


class InsecureKeyError(TurnstileError):
    """A client-managed agent would sign its state with no configured key, a key published in
    Turnstile's examples, docs or tests, or one too short, so anyone could forge its state;
    raised at startup by :func:`engine.state.signing.check_deployable_keys`."""


class TooManyTurnsError(AgentError):
    """The caller already has as many turns in flight as the server allows one principal
    (HTTP 429); ``retry_after`` is the number of seconds to wait before asking again."""

    default_status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ToolError(AgentError):
    """A tool raised, returned an output that violates its schema, or was given bad input."""


class TransientError(TurnstileError):
    """Mixin-style marker for failures worth retrying (timeouts, connection errors, 5xx).

    Models and tools raise a subclass (or set ``retryable=True`` on a :class:`ToolError`) so
    the worker pool can retry the turn with backoff instead of failing it.
    """


class TurnFailedError(AgentError):
    """The turn settled ``failed`` (or ``aborted``); ``snapshot_id`` is that resumable snapshot.

    ``response`` is the :class:`~engine.chat.AgentResponse` of the settled turn, so callers can
    still read its conversation; ``chat.send()`` with no arguments retries from it.
    """


class TurnTimeoutError(AgentError, TimeoutError):
    """The caller's ``timeout`` passed before its turn settled. The turn is left as it was —
    pending: queued, or running — and ``snapshot_id`` names it: wait again
    (``agent.wait(snapshot_id)``) or stop it (``agent.abort(snapshot_id)``). Also a
    :class:`TimeoutError`."""

    default_status = "DEADLINE_EXCEEDED"


class NoWorkerError(AgentError):
    """No worker claimed a queued turn within the time its caller would wait
    (``turnstile serve --worker-wait``). The turn is not failed: it stays queued, runs when a
    worker is free, and ``snapshot_id`` names it (wait for it or abort it). ``UNAVAILABLE``."""

    default_status = "UNAVAILABLE"


class StoreError(AgentError):
    """A store operation failed for a reason other than a lost race (driver errors are
    wrapped): status ``UNAVAILABLE``, worth retrying once the database is back.

    ``may_have_applied`` says whether a write may have taken effect all the same: ``True``
    when the connection was lost while the request was in flight (its commit may have
    landed), ``False`` when the database certainly did not apply it. Before retrying a
    write that may have applied, read it back (a turn by its snapshot id), or retry with
    the same idempotency key, which is safe either way.
    """

    default_status = "UNAVAILABLE"

    def __init__(
        self,
        message: str,
        *,
        may_have_applied: bool = False,
        status: str | None = None,
        snapshot_id: str | None = None,
    ) -> None:
        super().__init__(message, status=status, snapshot_id=snapshot_id)
        self.may_have_applied = may_have_applied

    def __str__(self) -> str:
        # The driver's or the race's own words, as logs and tracebacks have always shown them.
        return self.message

    def to_wire(self) -> dict[str, Any]:
        """As :meth:`AgentError.to_wire`, saying whether the request may have applied."""
        wire = super().to_wire()
        if self.may_have_applied:
            wire["message"] = (
                f"{self.message} The request may have been applied: read it back, or retry "
                "with the same idempotency key."
            )
        return wire


class StaleTransitionError(StoreError):
    """A guarded status transition matched zero rows: the turn is not in the expected state."""

    default_status = "ABORTED"

    def __init__(self, turn_id: str, message: str) -> None:
        super().__init__(message)
        self.turn_id = turn_id


class LeaseLostError(StaleTransitionError):
    """The caller's lease token is no longer the turn's: another worker owns the turn now."""
