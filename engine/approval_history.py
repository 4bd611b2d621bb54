"""The approval history: decided interrupts, who decided them, and what their turn did next.

The inbox (:class:`engine.store.Inbox`) reads the approvals still open; this is the read of the
ones already decided, by an inbox decision, a chat's resume or the expiry job, newest decision
first. A store offers it by implementing :class:`ApprovalHistory` (both shipped stores do);
callers check for it with ``isinstance``, so a store written against the older protocol keeps
working without a history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from engine.status import FinishReason, TurnStatus

__all__ = ["ApprovalHistory", "DecidedApproval", "DecisionQuery"]


class DecidedApproval(BaseModel):
    """One decided interrupt, with the turn that continued from its paused turn."""

    turn_id: str
    session_id: str
    agent: str
    #: The principal the session belongs to, who asked (``None`` for local sessions).
    owner: str | None = None
    round: int
    interrupt: str
    ref: str
    input: Any = None
    metadata: Any = None
    #: ``{"respond": output}`` or ``{"restart": metadata}``, as recorded (a restart with
    #: edited arguments also holds ``"edit"``, see :attr:`edit`).
    answer: Any = None
    decided_by: str | None = None
    decided_at: datetime
    #: When the interrupt was journaled (the approval's creation).
    created_at: datetime | None = None
    #: The first turn created from the paused one (the resume), once there is one.
    next_turn_id: str | None = None
    next_status: TurnStatus | None = None
    next_finish_reason: FinishReason | None = None
    #: When the approval's timeout escalated it before it was decided (``None``: it never did).
    escalated_at: datetime | None = None
    #: The group and the assignee that held it when it escalated.
    escalated_from_group: str | None = None
    escalated_from_assignee: str | None = None
    #: The group it escalated to.
    escalated_to: str | None = None

    @property
    def edit(self) -> dict[str, Any] | None:
        """The approver's edit of the call's arguments recorded with the decision: ``input``
        (the edited arguments), ``diff`` (``[{"field", "old", "new"}]``), ``by`` and ``at``."""
        edit = self.answer.get("edit") if isinstance(self.answer, dict) else None
        return edit if isinstance(edit, dict) else None

    @property
    def key(self) -> tuple[datetime, str, str]:
        """The history's order key: decision time, then turn and ref."""
        return self.decided_at, self.turn_id, self.ref


class DecisionQuery(BaseModel):
    """Filters and keyset page of :meth:`ApprovalHistory.list_decisions` (newest first)."""

    agents: tuple[str, ...] | None = None
    interrupt: str | None = None
    #: Only approvals of sessions owned by this principal (who asked).
    owner: str | None = None
    decided_by: str | None = None
    #: Keyset cursor: the ``(decided_at, turn_id, ref)`` of the last entry already seen.
    before: tuple[datetime, str, str] | None = None
    limit: int = Field(default=50, ge=1, le=1000)

    def admits(self, entry: DecidedApproval) -> bool:
        """Whether ``entry`` passes the filters and lies after the cursor (is older)."""
        return (
            (self.agents is None or entry.agent in self.agents)
            and (self.interrupt is None or entry.interrupt == self.interrupt)
            and (self.owner is None or entry.owner == self.owner)
            and (self.decided_by is None or entry.decided_by == self.decided_by)
            and (self.before is None or entry.key < self.before)
        )


@runtime_checkable
class ApprovalHistory(Protocol):
    """A store that can list decided approvals."""

    async def list_decisions(self, query: DecisionQuery) -> list[DecidedApproval]:
        """Decided interrupts, newest decision first (ties by turn id and ref, descending),
        filtered and keyset-paged by ``query``."""
        ...
