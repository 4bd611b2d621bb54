"""What the approval page shows of an approval's assignment (:mod:`engine.approvals.assignment`)."""

from __future__ import annotations

from typing import Any

from engine.approvals.assignment import current_assignment, may_act, needs_quorum
from engine.escalation import progress
from engine.remote.auth import Principal
from engine.remote.ui.queries import ApprovalFound

__all__ = ["assignment_context"]


async def assignment_context(found: ApprovalFound, principal: Principal | None) -> dict[str, Any]:
    """What the approval page shows of the approval's assignment, and which forms it offers."""
    assignment = await current_assignment(found.agent, found.approval)
    chain = getattr(found.agent.tools.get(found.approval.interrupt), "escalation", None)
    where = (
        progress(
            chain,
            assignment.escalation_step,
            created_at=found.approval.created_at,
            escalated_at=assignment.escalated_at,
            is_open=found.is_open,
        )
        if chain is not None
        else None
    )
    quorum = needs_quorum(found.agent, found.approval)
    acts = principal is not None and may_act(principal, assignment, quorum=quorum)
    acts = acts and found.is_open
    return {
        "assignment": assignment,
        "holder": assignment.describe(),
        "escalation": where,
        # Someone else's claim is taken over by assigning, not by claiming (which it refuses).
        "may_claim": acts and assignment.assignee is None,
        "may_release": (
            found.is_open and principal is not None and assignment.assignee == principal.id
        ),
        "may_assign": acts,
    }
