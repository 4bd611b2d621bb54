"""The approval page's assignment: who holds the approval, its escalation, and the claim,
release and assign forms.

Each form goes to :mod:`engine.approvals.assignment` (:func:`~engine.approvals.assignment.claim`,
:func:`~engine.approvals.assignment.release`, :func:`~engine.approvals.assignment.assign`), which
checks who may change what; the page only offers the forms that apply and shows the engine's
refusals.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engine.approval_policy import ApprovalRefusedError
from engine.approvals.assignment import assign, claim, release
from engine.approvals.decide import approval_id
from engine.errors import ApprovalNotPendingError, InvalidArgumentError
from engine.remote.ui.inbox_pages import ApprovalPages
from engine.remote.ui.kit import PageKit, Viewer, segment
from engine.remote.ui.queries import optional_id
from engine.store import ApprovalClaimedError

__all__ = ["AssignmentForms"]


class AssignmentForms:
    """``POST /ui/approvals/{id}/claim``, ``/release`` and ``/assign``."""

    def __init__(self, kit: PageKit, approvals: ApprovalPages) -> None:
        self.kit = kit
        self.approvals = approvals

    async def claim(self, request: Request, viewer: Viewer) -> Response:
        """The viewer takes the approval."""
        return await self._change(request, viewer, "claim")

    async def release(self, request: Request, viewer: Viewer) -> Response:
        """The viewer hands the approval back to its group."""
        return await self._change(request, viewer, "release")

    async def assign(self, request: Request, viewer: Viewer) -> Response:
        """Assign the approval to the person and/or group the form names."""
        return await self._change(request, viewer, "assign")

    async def _change(self, request: Request, viewer: Viewer, action: str) -> Response:
        form_data = await self.kit.form(request)
        self.kit.check_csrf(request, viewer, form_data)
        found = await self.approvals._find(request, viewer)
        decision_form = self.approvals._form(found)
        try:
            if action == "claim":
                await claim(found.agent, found.approval, viewer.principal)
            elif action == "release":
                await release(found.agent, found.approval, by=viewer.principal)
            else:
                await assign(
                    found.agent,
                    found.approval,
                    by=viewer.principal,
                    assignee=optional_id(form_data, "assignee", "The person to assign to"),
                    group=optional_id(form_data, "group", "The group to assign to"),
                )
        except InvalidArgumentError as problem:
            return await self.approvals._refused(
                request, viewer, found, decision_form, problem.message, status=400
            )
        except (ApprovalNotPendingError, ApprovalClaimedError) as late:
            return await self.approvals._refused(
                request, viewer, found, decision_form, late.message
            )
        except ApprovalRefusedError as refused:
            return await self.approvals._refused(
                request, viewer, found, decision_form, refused.message, status=403
            )
        done = {"claim": "claimed", "release": "released", "assign": "assigned"}[action]
        return self.kit.redirect(
            request,
            viewer,
            f"/ui/approvals/{segment(approval_id(found.approval.turn_id, found.approval.ref))}",
            **{done: "1"},
        )
