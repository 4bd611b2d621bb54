"""The turn state machine: one status enum, its allowed transitions, and finish reasons.

The database mirrors :class:`TurnStatus` as the PostgreSQL ENUM ``turn_status``; every store
moves a turn only along :data:`ALLOWED_TRANSITIONS`, through one guarded update.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = [
    "ACTIVE_STATUSES",
    "ALLOWED_TRANSITIONS",
    "RESUMABLE_STATUSES",
    "SETTLED_STATUSES",
    "FinishReason",
    "TurnStatus",
    "can_transition",
]


class TurnStatus(StrEnum):
    """Persistence lifecycle of one turn (= one snapshot).

    A turn paused at interrupts is ``completed`` with finish reason ``interrupted``: "paused"
    is not a status. Running vs. queued is not a status either: a ``pending`` turn runs while
    it holds a live lease.
    """

    PENDING = "pending"
    ABORTING = "aborting"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class FinishReason(StrEnum):
    """Why a turn ended, as Genkit's ``AgentFinishReason``."""

    STOP = "stop"
    LENGTH = "length"
    BLOCKED = "blocked"
    INTERRUPTED = "interrupted"
    OTHER = "other"
    UNKNOWN = "unknown"
    ABORTED = "aborted"
    DETACHED = "detached"
    FAILED = "failed"


#: Which status may follow which. ``aborting`` settles by how the work ended (Genkit PR #6311):
#: a turn that finished anyway is ``completed`` and one that errored for another reason is
#: ``failed``, so a finished turn is never labelled aborted and then run again on retry.
ALLOWED_TRANSITIONS: Mapping[TurnStatus, frozenset[TurnStatus]] = {
    TurnStatus.PENDING: frozenset(
        {
            TurnStatus.PENDING,
            TurnStatus.COMPLETED,
            TurnStatus.FAILED,
            TurnStatus.ABORTING,
            TurnStatus.ABORTED,
        }
    ),
    TurnStatus.ABORTING: frozenset({TurnStatus.ABORTED, TurnStatus.COMPLETED, TurnStatus.FAILED}),
    TurnStatus.COMPLETED: frozenset(),
    TurnStatus.FAILED: frozenset(),
    TurnStatus.ABORTED: frozenset(),
}

#: Statuses in which a turn still holds its session (at most one per session).
ACTIVE_STATUSES: frozenset[TurnStatus] = frozenset({TurnStatus.PENDING, TurnStatus.ABORTING})

#: Terminal statuses.
SETTLED_STATUSES: frozenset[TurnStatus] = frozenset(
    {TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.ABORTED}
)

#: A new turn may start from a snapshot in one of these statuses.
RESUMABLE_STATUSES: frozenset[TurnStatus] = SETTLED_STATUSES


def can_transition(current: TurnStatus, new: TurnStatus) -> bool:
    """Whether ``current → new`` is an edge of the state machine.

    ``pending → pending`` is allowed: it is how a worker hands a turn back for a retry
    (new ``run_after``, lease released) without settling it.
    """
    return new in ALLOWED_TRANSITIONS[current]
