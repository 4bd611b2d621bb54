"""The inbox page, its live updates, and the page of one approval with its decision form.

Every decision goes through :meth:`ApprovalPages.decision`, which hands it to
:func:`engine.approvals.decide.decide` — the path ``POST /inbox/{id}/decision`` takes — so each rule
about who may decide what, and which answers fit, is the engine's; the form only reports problems
earlier and on the right field.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from engine.agent import Agent
from engine.approval_policy import ApprovalRefusedError
from engine.approvals.decide import (
    Decision,
    approval_id,
    decide,
    parse_approval_id,
    yes_no_answer,
)
from engine.approvals.wording import Wording, word_approval
from engine.errors import (
    ApprovalNotPendingError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from engine.rejection import MAX_REASON_LENGTH, Rejection
from engine.remote.auth import Principal
from engine.remote.inbox_routes import policy_wire
from engine.remote.ui import present
from engine.remote.ui.assignment_view import assignment_context
from engine.remote.ui.forms import DecisionForm, build_form
from engine.remote.ui.kit import PageKit, Viewer, query_of, segment
from engine.remote.ui.queries import (
    AGE_CHOICES,
    ASSIGNED_CHOICES,
    ApprovalFound,
    InboxFilters,
    next_turn,
)
from engine.remote.wire import check_id
from engine.store import (
    EDIT,
    AlreadyVotedError,
    PendingApproval,
    ToolCallStatus,
    TurnRecord,
)

__all__ = ["ApprovalPages", "InboxPages"]

#: Approvals on one page of the inbox.
PAGE_SIZE = 25
#: The title counts open approvals up to this many (then shows "100+").
COUNT_CAP = 100


def _count_text(count: int) -> str:
    return f"{COUNT_CAP}+" if count >= COUNT_CAP else str(count)


def _live_key(rows: list[dict[str, Any]]) -> str:
    """What the live inbox compares to decide whether to swap its rows in: the approvals
    shown and what changes on them without a new turn (votes, who holds them)."""
    return "\n".join(f"{r['id']}|{r['votes']}|{r['assigned']}" for r in rows)


class InboxPages:
    """``GET /ui`` and the JSON its script polls."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    async def _rows(
        self,
        request: Request,
        approvals: list[PendingApproval],
        now: datetime,
        viewer: Viewer,
    ) -> list[dict[str, Any]]:
        held = await self.kit.catalog.assignments(approvals)
        agents = self.kit.catalog.engine.agents
        per_turn = Counter(a.turn_id for a in approvals)
        return [
            {
                **_words(word_approval(agents, a.agent, a.interrupt, a.input)),
                # Approvals one turn asks together sit side by side; the row says so.
                "together": per_turn[a.turn_id] - 1,
                "assigned": held[(a.turn_id, a.round, a.ref)].describe(),
                "votes": await self._votes_text(a, viewer),
                "id": approval_id(a.turn_id, a.ref),
                "href": self.kit.url(
                    request, f"/ui/approvals/{segment(approval_id(a.turn_id, a.ref))}"
                ),
                "interrupt": a.interrupt,
                "agent": a.agent,
                # A version shows only when it is not the one served now.
                "version": a.app_version if _other_version(agents, a) else None,
                "requester": a.owner,
                "created_at": a.created_at,
                "age": present.ago(a.created_at, now),
                "deadline": a.deadline,
                "deadline_in": present.ago(a.deadline, now) if a.deadline else "",
                "overdue": a.deadline is not None and a.deadline <= now,
            }
            for a in approvals
        ]

    async def _votes_text(self, approval: PendingApproval, viewer: Viewer) -> str:
        """``"1 of 2 approvals"`` for an interrupt with an approval policy, else ``""``."""
        agent = self.kit.catalog.engine.agents.get(approval.agent)
        if agent is None or agent.store is None:
            return ""
        policy = await policy_wire(agent, agent.store, approval, viewer.principal)
        if policy is None:
            return ""
        return f"{policy['approvals']} of {policy['requiredApprovals']} approvals"

    async def inbox(self, request: Request, viewer: Viewer) -> Response:
        """The open approvals the viewer may decide: filters, order, pages, a live count."""
        filters = InboxFilters.from_query(query_of(request))
        catalog = self.kit.catalog
        page = await catalog.open_approvals(viewer.principal, filters, limit=PAGE_SIZE)
        count = await catalog.count_open(
            viewer.principal, replace(filters, cursor=None), cap=COUNT_CAP
        )
        rows = await self._rows(request, page.items, datetime.now(UTC), viewer)
        context = {
            "nav": "inbox",
            "filters": filters,
            "rows": rows,
            "live_key": _live_key(rows),
            "count": count,
            "count_text": _count_text(count),
            "agents": catalog.agent_names(),
            "interrupts": catalog.interrupt_names(),
            "ages": AGE_CHOICES,
            "assigned_choices": ASSIGNED_CHOICES,
            "next_query": filters.query(cursor=page.next_cursor) if page.next_cursor else None,
            "first_query": filters.query(cursor=None) if filters.cursor else None,
            "live_query": filters.query(cursor=None),
        }
        return self.kit.page(request, viewer, "inbox.html", context)

    async def live(self, request: Request, viewer: Viewer) -> Response:
        """The first page's rows and the count, for the inbox's script to swap in."""
        filters = replace(InboxFilters.from_query(query_of(request)), cursor=None)
        catalog = self.kit.catalog
        page = await catalog.open_approvals(viewer.principal, filters, limit=PAGE_SIZE)
        count = await catalog.count_open(viewer.principal, filters, cap=COUNT_CAP)
        shown = await self._rows(request, page.items, datetime.now(UTC), viewer)
        rows = self.kit.env.get_template("_inbox_rows.html").render(rows=shown)
        body = {
            "count": count,
            "countText": _count_text(count),
            "rows": rows,
            "ids": [approval_id(a.turn_id, a.ref) for a in page.items],
            "key": _live_key(shown),
        }
        return self.kit.json(request, viewer, body)


class ApprovalPages:
    """``GET /ui/approvals/{id}`` and the one handler every decision goes through."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    async def _find(self, request: Request, viewer: Viewer) -> ApprovalFound:
        raw = request.path_params["approval_id"]
        turn_id, ref = parse_approval_id(raw)
        check_id(turn_id, "The turn id of the approval id")
        check_id(ref, "The ref of the approval id")
        found = await self.kit.catalog.approval(viewer.principal, turn_id, ref)
        if found is None:
            raise NotFoundError(f"Approval '{raw}' not found.")
        return found

    def _form(self, found: ApprovalFound) -> DecisionForm:
        tool = found.agent.tools.get(found.approval.interrupt)
        return build_form(tool.output.json_schema() if tool is not None else None)

    async def show(self, request: Request, viewer: Viewer) -> Response:
        """The approval: what is asked, the call, the conversation, and the form or result."""
        found = await self._find(request, viewer)
        query = query_of(request)
        notice = None
        if query.get("decided"):
            notice = "Your decision was recorded."
        elif query.get("voted"):
            notice = "Your vote was recorded; the approval waits for more approvals."
        elif query.get("claimed"):
            notice = "You hold this approval now."
        elif query.get("released"):
            notice = "You released this approval."
        elif query.get("assigned"):
            notice = "The assignment was changed."
        context = await self._context(
            found, self._form(found), notice=notice, principal=viewer.principal
        )
        return self.kit.page(request, viewer, "approval.html", context)

    async def state(self, request: Request, viewer: Viewer) -> Response:
        """A fingerprint of the approval and the turn that continued it (the page's script
        reloads when it changes)."""
        found = await self._find(request, viewer)
        following = None if found.is_open else await next_turn(found.store, await self._turn(found))
        return self.kit.json(request, viewer, {"state": _fingerprint(found, following)})

    async def _turn(self, found: ApprovalFound) -> TurnRecord:
        turn = await found.store.get_turn(found.approval.turn_id)
        if turn is None:  # pragma: no cover - deleted between two reads (retention)
            raise NotFoundError(f"Snapshot '{found.approval.turn_id}' not found.")
        return turn

    async def decision(self, request: Request, viewer: Viewer) -> Response:
        """Record a decision from the form: approve, respond with the form's answer, edit
        and approve, reject with a reason, or restart."""
        form_data = await self.kit.form(request)
        self.kit.check_csrf(request, viewer, form_data)
        found = await self._find(request, viewer)
        form = self._form(found)
        if not found.is_open:
            return await self._refused(
                request, viewer, found, form, "This approval was already decided."
            )
        action = form_data.get("action")
        seen = _arguments_seen(form_data)
        edit_form: DecisionForm | None = None
        reason = form_data.get("reason", "")
        if action == "reject":
            try:
                choice = Decision(reject=Rejection(reason=reason), arguments=seen)
            except ValidationError:
                problem = f"Give a reason of 1 to {MAX_REASON_LENGTH} characters to reject."
                return await self._again(
                    request, viewer, found, form, reject=(reason[: MAX_REASON_LENGTH * 2], problem)
                )
        elif action in ("approve", "restart"):
            choice = (
                self._approval(found, seen)
                if action == "approve"
                else Decision(restart=True, arguments=seen)
            )
        elif action == "edit":
            edit_form = await self._edit_form(found)
            if edit_form is None:
                raise FailedPreconditionError(
                    f"Tool '{found.approval.interrupt}' is not editable: approve it as it is."
                )
            reading = edit_form.read(form_data)
            edit_form = reading.form
            if not reading.ok:
                return await self._again(request, viewer, found, form, edit_form)
            choice = Decision(restart=True, edit=reading.answer, arguments=seen)
        elif action == "respond":
            reading = form.read(form_data)
            if not reading.ok:
                return await self._again(request, viewer, found, reading.form)
            form = reading.form
            choice = Decision(respond=reading.answer, arguments=seen)
        else:
            raise InvalidArgumentError(
                "The form's action must be 'approve', 'respond', 'restart', 'edit' or 'reject'."
            )
        try:
            outcome = await decide(
                found.agent,
                found.approval,
                choice,
                decided_by=viewer.id,
                approver=viewer.principal,
            )
        except InvalidArgumentError as problem:
            if action == "reject":
                return await self._again(
                    request, viewer, found, form, reject=(reason, problem.message)
                )
            if edit_form is not None:
                edit_form = edit_form.with_error(problem.message)
            else:
                form = form.with_error(problem.message)
            return await self._again(request, viewer, found, form, edit_form)
        except (ApprovalNotPendingError, AlreadyVotedError) as late:
            return await self._refused(request, viewer, found, form, late.message)
        except ApprovalRefusedError as refused:
            return await self._refused(request, viewer, found, form, refused.message, status=403)
        done = {"decided": "1"} if outcome.is_decided else {"voted": "1"}
        return self.kit.redirect(
            request,
            viewer,
            f"/ui/approvals/{segment(approval_id(found.approval.turn_id, found.approval.ref))}",
            **done,
        )

    def _approval(self, found: ApprovalFound, seen: Any) -> Decision:
        """What the Approve button decides: a tool that paused itself runs (a restart); an
        interrupt answering a yes or a no is answered yes."""
        tool = found.agent.tools.get(found.approval.interrupt)
        if tool is not None and not tool.is_interrupt:
            return Decision(restart=True, arguments=seen)
        yes = _plain_yes(found)
        if yes is None:
            raise InvalidArgumentError(
                f"'{found.approval.interrupt}' answers more than yes or no: use its form."
            )
        return Decision(respond=yes, arguments=seen)

    async def _edit_form(self, found: ApprovalFound) -> DecisionForm | None:
        """The form editing the paused call's arguments (``None``: the tool is not editable),
        filled with the arguments as they stand: the latest edit a vote made, else the
        call's own."""
        tool = found.agent.tools.get(found.approval.interrupt)
        if tool is None or tool.is_interrupt or not tool.editable:
            return None
        current = await _standing_arguments(found)
        return build_form(tool.input.json_schema()).filled(current, prefix="edit")

    async def _again(
        self,
        request: Request,
        viewer: Viewer,
        found: ApprovalFound,
        form: DecisionForm,
        edit_form: DecisionForm | None = None,
        *,
        reject: tuple[str, str] | None = None,
    ) -> Response:
        """The page again with the form's problems marked (400, nothing recorded); ``reject``
        is the reason typed and what is wrong with the reject."""
        context = await self._context(found, form, principal=viewer.principal, edit_form=edit_form)
        if reject is not None:
            context["reject_reason"], context["reject_error"] = reject
        return self.kit.page(request, viewer, "approval.html", context, status=400)

    async def _refused(
        self,
        request: Request,
        viewer: Viewer,
        found: ApprovalFound,
        form: DecisionForm,
        message: str,
        *,
        status: int = 409,
    ) -> Response:
        """The page as it is now, saying why the decision was not recorded (409, or 403 when
        the approval policy refused the viewer)."""
        fresh = await self.kit.catalog.approval(
            viewer.principal, found.approval.turn_id, found.approval.ref
        )
        context = await self._context(
            fresh or found, form, problem=message, principal=viewer.principal
        )
        return self.kit.page(request, viewer, "approval.html", context, status=status)

    async def _context(
        self,
        found: ApprovalFound,
        form: DecisionForm,
        *,
        notice: str | None = None,
        problem: str | None = None,
        principal: Principal | None = None,
        edit_form: DecisionForm | None = None,
    ) -> dict[str, Any]:
        approval, call, store = found.approval, found.call, found.store
        if edit_form is None and found.is_open:
            edit_form = await self._edit_form(found)
        edit = call.answer.get(EDIT) if isinstance(call.answer, dict) else None
        tool = found.agent.tools.get(approval.interrupt)
        now = datetime.now(UTC)
        conversation = await store.load_conversation(approval.turn_id)
        journal = await store.list_calls(approval.turn_id)
        statuses = {(c.round, c.ref): c.status.value for c in journal}
        paused = next(
            (
                m
                for m in reversed(conversation)
                if any(p.tool_request and p.tool_request.ref == approval.ref for p in m.content)
            ),
            None,
        )
        agents = {approval.agent: found.agent}
        others = [
            {
                "name": p.tool_request.name,
                "ref": p.tool_request.ref or "",
                "status": statuses.get((approval.round, p.tool_request.ref or ""), "—"),
                "rows": present.value_rows(p.tool_request.input),
                "headline": word_approval(
                    agents, approval.agent, p.tool_request.name, p.tool_request.input
                ).headline,
            }
            for p in (paused.content if paused else [])
            if p.tool_request is not None and p.tool_request.ref != approval.ref
        ]
        following = None
        if not found.is_open:
            following = await next_turn(store, await self._turn(found))
        waiting = [
            c
            for c in journal
            if c.status is ToolCallStatus.INTERRUPTED and c.decided_at is None and c.interrupt
        ]
        metadata = approval.metadata if approval.metadata not in (None, True) else None
        return {
            "nav": "inbox",
            "approval": approval,
            "approval_id": approval_id(approval.turn_id, approval.ref),
            "words": _words(
                word_approval(agents, approval.agent, approval.interrupt, approval.input)
            ),
            "other_version": _other_version(agents, approval),
            "call": call,
            "is_open": found.is_open,
            "is_interrupt": tool is None or tool.is_interrupt,
            # One click approves a tool that paused itself, or an interrupt asking yes or no.
            "can_approve": (tool is not None and not tool.is_interrupt)
            or _plain_yes(found) is not None,
            "description": tool.description if tool is not None else "",
            "input_rows": present.schema_rows(
                tool.input.json_schema() if tool is not None else None, approval.input
            ),
            "metadata_rows": present.value_rows(metadata) if metadata is not None else (),
            "others": others,
            "messages": present.message_views(conversation),
            "asked_ago": present.ago(approval.created_at, now),
            "deadline_in": present.ago(approval.deadline, now) if approval.deadline else "",
            "overdue": approval.deadline is not None and approval.deadline <= now,
            "form": form,
            "answer_rows": _answer_rows(call.answer),
            "edit_form": edit_form,
            # Tool calls carry the arguments the page shows, so a decision taken on arguments
            # another approver edited meanwhile is refused instead of counted.
            "arguments_json": (
                json.dumps(await _standing_arguments(found))
                if tool is not None and not tool.is_interrupt and found.is_open
                else ""
            ),
            "edit": edit if isinstance(edit, dict) else None,
            "restarted": isinstance(call.answer, dict) and "restart" in call.answer,
            "following": following,
            "following_text": present.outcome(
                following.status.value if following else None,
                following.finish_reason.value if following and following.finish_reason else None,
            ),
            # Each approval the turn still waits for, to link from this one.
            "waiting": [
                {
                    "id": approval_id(approval.turn_id, c.ref),
                    "ref": c.ref,
                    "headline": word_approval(agents, approval.agent, c.name, c.input).headline,
                }
                for c in waiting
                if c.ref != approval.ref
            ],
            "notice": notice,
            "problem": problem,
            "max_reason": MAX_REASON_LENGTH,
            "reject_reason": "",
            "reject_error": None,
            "policy": await policy_wire(found.agent, store, approval, principal),
            "state": _fingerprint(found, following),
            **await assignment_context(found, principal),
        }


def _words(said: Wording) -> dict[str, str]:
    """What a row or a page shows of an approval's wording."""
    return {"headline": said.headline, "subline": said.subline, "title": said.title}


def _other_version(agents: Mapping[str, Agent], approval: PendingApproval) -> bool:
    """Whether ``approval`` was asked under another app version than the one served now."""
    served = agents.get(approval.agent)
    return bool(approval.app_version) and (served is None or served.version != approval.app_version)


async def _standing_arguments(found: ApprovalFound) -> Any:
    """The paused call's arguments as they stand: the latest edit a vote made, else its own."""
    current = found.approval.input
    approval = found.approval
    for vote in await found.store.list_votes(approval.turn_id, approval.round, approval.ref):
        if isinstance(vote.answer, dict) and isinstance(vote.answer.get(EDIT), dict):
            current = vote.answer[EDIT]["input"]
    return current


def _plain_yes(found: ApprovalFound) -> Any:
    """The answer "yes" of an interrupt whose output is a yes or a no (``None``: it asks
    more, or the approval is no interrupt of this app)."""
    tool = found.agent.tools.get(found.approval.interrupt)
    if tool is None or not tool.is_interrupt:
        return None
    return yes_no_answer(tool.output.json_schema(), True)


def _arguments_seen(form_data: Mapping[str, str]) -> Any:
    """The arguments the page showed the approver (its hidden field), or ``None``."""
    text = form_data.get("arguments")
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError("The form's arguments field is not JSON.") from exc


def _fingerprint(found: ApprovalFound, following: TurnRecord | None) -> str:
    """What the approval page shows of the approval's state, as one string."""
    parts = [
        "open" if found.is_open else "closed",
        found.call.decided_at.isoformat() if found.call.decided_at else "",
        f"{following.id}:{following.status}:{following.finish_reason}" if following else "",
    ]
    return "|".join(parts)


def _answer_rows(answer: Any) -> tuple[present.Row, ...]:
    if isinstance(answer, dict) and "respond" in answer:
        return present.value_rows(answer["respond"])
    return ()
