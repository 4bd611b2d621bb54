"""The records of approval assignment (:mod:`engine.assignment`) and the store protocol that
keeps them: what the stores import, without the engine's agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from engine.assignment_guard import Assignment, AssignmentChangedError, check_assignment_seen
from engine.errors import AgentError
from engine.store import PendingApproval

__all__ = [
    "ApprovalClaimedError",
    "Assignment",
    "AssignmentBook",
    "AssignmentChange",
    "AssignmentChangedError",
    "DueQuery",
    "Key",
    "apply_change",
    "check_assignment_seen",
]

Key = tuple[str, int, str]


class ApprovalClaimedError(AgentError):
    """Someone else holds this approval (HTTP 409): they release it, or it is reassigned."""

    default_status = "ABORTED"


class AssignmentChange(BaseModel):
    """One change of an approval's assignment, and the guard the store checks with it.

    * ``claim``: ``assignee = by``, only when nobody or ``by`` holds it;
    * ``assign``: ``group`` (when given; the assignee then becomes ``assignee``) and/or
      ``assignee``;
    * ``release``: no assignee, only when ``holder`` holds it (``holder=None``: whoever does);
    * ``escalate``: ``group = group``, no assignee, the previous ones recorded, only when not
      escalated before;
    * ``remind``: ``last_reminded_at = now``, only when not reminded in the last
      ``every_seconds``.
    """

    action: Literal["claim", "assign", "release", "escalate", "remind"]
    by: str | None = None
    assignee: str | None = None
    group: str | None = None
    holder: str | None = None
    every_seconds: float | None = None
    #: The moment of the change (``None``: the store's clock); the sweep passes its own.
    at: datetime | None = None


class DueQuery(BaseModel):
    """Open approvals of one interrupt due for an escalation or a reminder."""

    agents: tuple[str, ...]
    interrupt: str
    #: Only approvals created at or before this moment.
    created_before: datetime
    #: Only approvals not escalated yet.
    unescalated: bool = False
    #: Only approvals never reminded, or last reminded at or before this moment.
    reminded_before: datetime | None = None
    limit: int = 100


@runtime_checkable
class AssignmentBook(Protocol):
    """A store that keeps assignments (the memory, SQLite and PostgreSQL stores)."""

    async def get_assignments(self, keys: Sequence[Key]) -> dict[Key, Assignment]:
        """The stored assignments of these ``(turn_id, round, ref)`` approvals (absent: none
        stored yet)."""
        ...

    async def change_assignment(
        self,
        turn_id: str,
        round: int,
        ref: str,
        change: AssignmentChange,
        *,
        default_group: str | None,
    ) -> Assignment | None:
        """Apply ``change`` to one open approval in one guarded write, starting from
        ``default_group`` when nothing is stored for it yet; the assignment after the change,
        or ``None`` when the change's guard refused it (nothing written).

        Raises :class:`~engine.errors.ApprovalNotPendingError` when the approval is not open.
        """
        ...

    async def list_due_approvals(self, query: DueQuery) -> list[PendingApproval]:
        """Open approvals matching ``query``, oldest first."""
        ...


def apply_change(current: Assignment, change: AssignmentChange, now: datetime) -> Assignment | None:
    """``current`` after ``change`` (``None``: the change's guard refuses it); the rules the
    SQL stores write as guarded UPDATEs, for the in-memory store."""
    now = change.at or now
    stamp: dict[str, Any] = {"assigned_by": change.by, "assigned_at": now}
    if change.action == "claim":
        if current.assignee not in (None, change.by):
            return None
        return current.model_copy(update={"assignee": change.by, **stamp})
    if change.action == "assign":
        if change.group is not None:
            stamp.update(group=change.group, assignee=change.assignee)
        else:
            stamp["assignee"] = change.assignee
        return current.model_copy(update=stamp)
    if change.action == "release":
        if current.assignee is None or change.holder not in (None, current.assignee):
            return None
        return current.model_copy(update={"assignee": None, **stamp})
    if change.action == "escalate":
        if current.escalated_at is not None:
            return None
        return current.model_copy(
            update={
                "escalated_from_assignee": current.assignee,
                "escalated_from_group": current.group,
                "escalated_to": change.group,
                "escalated_at": now,
                "group": change.group,
                "assignee": None,
                **stamp,
            }
        )
    assert change.every_seconds is not None, "a reminder needs its interval"
    last = current.last_reminded_at
    if last is not None and last > now - timedelta(seconds=change.every_seconds):
        return None
    return current.model_copy(update={"last_reminded_at": now, "reminders": current.reminders + 1})
