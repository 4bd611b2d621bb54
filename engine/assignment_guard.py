"""An open approval's assignment, and the guard that a decision or a vote checks against it
under the lock that records it (:mod:`engine.assignment` has the rules). Apart from the store
protocol (:mod:`engine.assignment_records`), so that :mod:`engine.store` can name it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from engine.errors import ApprovalNotPendingError

__all__ = ["Assignment", "AssignmentChangedError", "check_assignment_seen"]


class AssignmentChangedError(ApprovalNotPendingError):
    """The approval was claimed, reassigned, released or escalated after the decider's check
    (HTTP 409): nothing was recorded, and the decider may no longer be allowed to decide it."""


class Assignment(BaseModel):
    """Who an open approval is assigned to, and its escalation and reminders so far."""

    turn_id: str
    round: int
    ref: str
    assignee: str | None = None
    group: str | None = None
    assigned_by: str | None = None
    assigned_at: datetime | None = None
    escalated_at: datetime | None = None
    escalated_from_assignee: str | None = None
    escalated_from_group: str | None = None
    escalated_to: str | None = None
    last_reminded_at: datetime | None = None
    reminders: int = 0

    @property
    def is_assigned(self) -> bool:
        """Whether anyone (a person or a group) holds it."""
        return self.assignee is not None or self.group is not None

    def describe(self) -> str:
        """``"alice"``, ``"group payments"``, ``"alice (group payments)"`` or ``"nobody"``."""
        if self.assignee and self.group:
            return f"{self.assignee} (group {self.group})"
        if self.assignee:
            return self.assignee
        if self.group:
            return f"group {self.group}"
        return "nobody"

    @property
    def version(self) -> tuple[Any, ...] | None:
        """What a claim, assignment, release or escalation changes (a reminder does not);
        ``None`` while nobody changed the interrupt's default assignment."""
        if self.assigned_at is None:
            return None
        return (self.assignee, self.group, self.assigned_by, self.assigned_at, self.escalated_at)


def check_assignment_seen(
    turn_id: str, ref: str, seen: Assignment, stored: Assignment | None
) -> None:
    """Refuse a decision or vote whose decider was checked against the assignment ``seen``
    when the approval's stored assignment (``None``: none stored) has changed since. Stores
    call it under the lock that records the decision or vote, so that who may decide is what
    the check saw when the decision lands."""
    now = stored.version if stored is not None else None
    if now != seen.version:
        holder = stored.describe() if stored is not None else "its default"
        raise AssignmentChangedError(
            f"Interrupt '{ref}' of snapshot {turn_id} was reassigned while your decision was "
            f"being recorded (it is now assigned to {holder}); nothing was recorded.",
            snapshot_id=turn_id,
        )
