"""HTTP routes of the approval inbox (beyond Genkit): list, show and decide open approvals.

* ``GET /inbox`` — open approvals across sessions, oldest first. Query parameters: ``agent``,
  ``interrupt``, ``owner``, ``min_age`` (seconds), ``limit`` (1 to 200, default 50), ``cursor``
  (from the previous page's ``nextCursor``). Filters and the ids in a path or a cursor follow
  the wire's id rule (:data:`~engine.remote.wire.ID_RULE`): anything else is a 400.
* ``GET /inbox/{id}`` — one approval with its turn's conversation.
* ``POST /inbox/{id}/decision`` — ``{"respond": output}``, ``{"restart": true}`` or
  ``{"reject": {"reason": text}}`` (:mod:`engine.rejection`); 409 when
  the approval was decided or answered already. When it was the last undecided call of its
  turn, the resume is enqueued and its snapshot id returned. On an interrupt with an approval
  policy (:mod:`engine.approval_policy`) it is a vote: 403 when the policy refuses this
  principal (maker-checker included), 409 when it voted already, and ``decided: false`` while
  the quorum is not reached.

Each entry carries ``title`` and ``summary``: what it asks in the approver's words, as the
app declared them on the interrupt or tool (:mod:`engine.approvals.wording`), else the
interrupt's name and its input's values in one line.

Entries of interrupts with an approval policy carry ``policy``: who may vote, the approvals
required, the votes so far and whether the caller may still vote (``null`` without a policy).

A principal only ever sees what the :class:`~engine.remote.auth.InboxPolicy` lets it decide;
anything else is a 404, so the inbox does not reveal other principals' approvals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.agent import Agent
from engine.approvals.assignment import (
    assign,
    assigned_matches,
    claim,
    current_assignment,
    current_assignments,
    needs_quorum,
    release,
)
from engine.approvals.decide import (
    Decision,
    approval_id,
    approval_policy,
    decide,
    find_approval,
    parse_approval_id,
)
from engine.approvals.wording import word_approval
from engine.engine import Engine
from engine.errors import AgentError, ApprovalNotPendingError, InvalidArgumentError, NotFoundError
from engine.remote.auth import InboxPolicy, Principal
from engine.remote.cursors import CursorKey, CursorSeal
from engine.remote.wire import check_id, check_text, error_response, read_json
from engine.store import ApprovalQuery, Assignment, PendingApproval, SessionStore, Vote

__all__ = [
    "InboxRoutes",
    "assignment_wire",
    "gather_rows",
    "policy_wire",
    "served_stores",
    "take_page",
    "vote_wire",
]

T = TypeVar("T")

MAX_PAGE = 200
#: The filters that name an agent, an interrupt or a principal: ids, bounded as ids are.
ID_FILTERS = ("agent", "interrupt", "owner")


class _AnyText(Convertor[str]):
    """Starlette's ``path`` convertor, but matching newlines too: an approval id holding one
    must reach the id check (a 400), not miss every route (a 404 "no route")."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


# Registered under a name of our own, so Starlette's "path" is unchanged for other apps.
register_url_convertor("turnstile_any", _AnyText())


def _wire(approval: PendingApproval, now: datetime, agents: Mapping[str, Agent]) -> dict[str, Any]:
    said = word_approval(agents, approval.agent, approval.interrupt, approval.input)
    return {
        "id": approval_id(approval.turn_id, approval.ref),
        "title": said.title,
        "summary": said.summary,
        "turnId": approval.turn_id,
        "sessionId": approval.session_id,
        "agent": approval.agent,
        "appVersion": approval.app_version,
        "owner": approval.owner,
        "interrupt": approval.interrupt,
        "ref": approval.ref,
        "input": approval.input,
        "metadata": approval.metadata,
        "deadline": approval.deadline.isoformat() if approval.deadline else None,
        "createdAt": approval.created_at.isoformat(),
        "ageSeconds": round((now - approval.created_at).total_seconds(), 3),
    }


def assignment_wire(assignment: Assignment) -> dict[str, Any]:
    """Who holds an approval, and its escalation and reminders, as JSON."""

    def moment(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "assignee": assignment.assignee,
        "group": assignment.group,
        "assignedBy": assignment.assigned_by,
        "assignedAt": moment(assignment.assigned_at),
        "escalatedAt": moment(assignment.escalated_at),
        "escalatedFromAssignee": assignment.escalated_from_assignee,
        "escalatedFromGroup": assignment.escalated_from_group,
        "escalatedTo": assignment.escalated_to,
        "escalationStep": assignment.escalation_step,
        "reminders": assignment.reminders,
        "lastRemindedAt": moment(assignment.last_reminded_at),
    }


def vote_wire(vote: Vote) -> dict[str, Any]:
    """One recorded vote as JSON."""
    return {
        "voter": vote.voter,
        "approves": vote.approves,
        "answer": vote.answer,
        "votedAt": vote.voted_at.isoformat(),
    }


async def policy_wire(
    agent: Agent,
    store: SessionStore,
    approval: PendingApproval,
    principal: Principal | None,
) -> dict[str, Any] | None:
    """The approval policy of ``approval`` with its votes so far (``None``: no policy)."""
    policy = approval_policy(agent, approval)
    if policy is None:
        return None
    votes = await store.list_votes(approval.turn_id, approval.round, approval.ref)
    return {
        "approvers": policy.who(),
        "requiredApprovals": policy.required_approvals,
        "approvals": sum(v.approves for v in votes),
        "requesterMayApprove": policy.requester_may_approve,
        "votes": [vote_wire(v) for v in votes],
        "mayVote": policy.may_vote(
            principal, requester=approval.owner, voted={v.voter for v in votes}
        ),
    }


def _key(approval: PendingApproval) -> tuple[datetime, str, str]:
    """The inbox's order: oldest first, then by turn and ref (the cursor holds this key)."""
    return approval.created_at, approval.turn_id, approval.ref


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a number, not {raw!r}.") from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be between {low:g} and {high:g}.")
    return value


def served_stores(
    agents: Mapping[str, Agent], agent: str | None = None
) -> list[tuple[SessionStore, tuple[str, ...]]]:
    """Each store of the served ``agents`` (or of the one named ``agent``), with the agents it
    holds."""
    grouped: dict[int, tuple[SessionStore, list[str]]] = {}
    for name, served in agents.items():
        if served.store is None or (agent is not None and name != agent):
            continue
        grouped.setdefault(id(served.store), (served.store, []))[1].append(name)
    return [(store, tuple(names)) for store, names in grouped.values()]


async def gather_rows(
    stores: Sequence[tuple[SessionStore, tuple[str, ...]]],
    fetch: Callable[[SessionStore, tuple[str, ...], int], Awaitable[list[T]]],
    key: Callable[[T], CursorKey],
    *,
    limit: int,
    descending: bool,
) -> tuple[list[T], bool]:
    """The rows of several stores for one page of ``limit``, in ``key`` order, and whether
    rows were held back for the next page.

    ``fetch`` reads up to a count of rows of the given agents from one store. Each store is
    asked for one row more than a page, to know whether it has more. Rows past the nearest
    last key of a store that has more are not known to be complete (that store may hold rows
    before them): they are held back.
    """
    examined: list[T] = []
    horizon: CursorKey | None = None
    for store, agents in stores:
        rows = await fetch(store, agents, limit + 1)
        if len(rows) > limit:
            last = key(rows[-1])
            if horizon is None:
                horizon = last
            else:
                horizon = max(horizon, last) if descending else min(horizon, last)
        examined.extend(rows)
    examined.sort(key=key, reverse=descending)
    if horizon is None:
        return examined, False
    bound = horizon
    return [r for r in examined if (key(r) >= bound if descending else key(r) <= bound)], True


def take_page(
    rows: Sequence[T],
    key: Callable[[T], CursorKey],
    *,
    limit: int,
    visible: Callable[[T], bool],
    held_back: bool,
    cursors: CursorSeal,
) -> tuple[list[T], str | None]:
    """Up to ``limit`` of ``rows`` (from :func:`gather_rows`) that ``visible`` keeps, and the
    cursor of the next page, sealed by ``cursors`` (``None``: this is the last).

    The permission hook may hide rows the store returned: they are skipped, not counted, and
    the cursor moves past them so the next page does not stop short.
    """
    page: list[T] = []
    seen = 0
    for row in rows:
        if len(page) == limit:
            break
        seen += 1
        if visible(row):
            page.append(row)
    more = seen < len(rows) or held_back
    return page, cursors.seal(key(rows[seen - 1])) if more and seen else None


class InboxRoutes:
    """The inbox endpoints of one app."""

    def __init__(
        self,
        engine: Engine,
        authenticate: Callable[[Request], Awaitable[Principal | None]],
        policy: InboxPolicy,
        max_body_bytes: int,
        cursors: CursorSeal,
    ) -> None:
        self.engine = engine
        self.authenticate = authenticate
        self.policy = policy
        self.max_body_bytes = max_body_bytes
        self.cursors = cursors

    def routes(self) -> list[Route]:
        """The Starlette routes (the decision route first: ids may hold slashes)."""
        return [
            Route("/inbox", self.list, methods=["GET"]),
            Route("/inbox/{approval_id:turnstile_any}/decision", self.decision, methods=["POST"]),
            Route(
                "/inbox/{approval_id:turnstile_any}/assignment", self.assignment, methods=["POST"]
            ),
            Route("/inbox/{approval_id:turnstile_any}", self.show, methods=["GET"]),
        ]

    async def list(self, request: Request) -> Response:
        try:
            principal = await self.authenticate(request)
            params = request.query_params
            for name, value in params.multi_items():
                check_text(value, f"Query parameter {name!r}")
                # An empty filter means "no filter", as it always has.
                if name in ID_FILTERS and value:
                    check_id(value, f"Query parameter {name!r}")
            assigned = params.get("assigned") or None
            if assigned not in (None, "me", "groups", "unassigned"):
                raise InvalidArgumentError("assigned must be 'me', 'groups' or 'unassigned'.")
            limit = int(_number(request, "limit", 50, 1, MAX_PAGE))
            min_age = _number(request, "min_age", 0, 0, 10 * 365 * 86400)
            now = datetime.now(UTC)
            allowed = self.policy.owner_filter(principal)
            owner = params.get("owner")
            if allowed is not None and owner is not None and owner != allowed:
                return JSONResponse({"items": [], "nextCursor": None})
            query = ApprovalQuery(
                interrupt=params.get("interrupt"),
                owner=owner or allowed,
                created_before=now - timedelta(seconds=min_age) if min_age else None,
                after=self.cursors.open(params["cursor"]) if params.get("cursor") else None,
                limit=limit,
            )

            async def fetch(
                store: SessionStore, agents: tuple[str, ...], count: int
            ) -> list[PendingApproval]:
                return await store.list_approvals(
                    query.model_copy(update={"agents": agents, "limit": count})
                )

            known, held_back = await gather_rows(
                served_stores(self.engine.agents, params.get("agent")),
                fetch,
                _key,
                limit=limit,
                descending=False,
            )
        except AgentError as error:
            return error_response(error)
        held = await current_assignments(self.engine.agents, known)

        def visible(approval: PendingApproval) -> bool:
            quorum = needs_quorum(self.engine.agents.get(approval.agent), approval)
            return self.policy.can_decide(principal, approval) and assigned_matches(
                principal,
                held[(approval.turn_id, approval.round, approval.ref)],
                assigned,
                quorum=quorum,
            )

        page, next_cursor = take_page(
            known, _key, limit=limit, visible=visible, held_back=held_back, cursors=self.cursors
        )
        items = []
        for approval in page:
            item = _wire(approval, now, self.engine.agents)
            item["policy"] = await self._policy(approval, principal)
            item["assignment"] = assignment_wire(
                held[(approval.turn_id, approval.round, approval.ref)]
            )
            items.append(item)
        return JSONResponse({"items": items, "nextCursor": next_cursor})

    async def _policy(
        self, approval: PendingApproval, principal: Principal | None
    ) -> dict[str, Any] | None:
        served = self.engine.agents.get(approval.agent)
        if served is None or served.store is None:
            return None
        return await policy_wire(served, served.store, approval, principal)

    async def _visible(
        self, request: Request, principal: Principal | None
    ) -> tuple[PendingApproval, bool, SessionStore]:
        turn_id, ref = parse_approval_id(request.path_params["approval_id"])
        check_id(turn_id, "The turn id of the approval id")
        check_id(ref, "The ref of the approval id")
        for store, _agents in served_stores(self.engine.agents):
            found = await find_approval(store, turn_id, ref)
            if found is None:
                continue
            approval, is_open = found
            served = approval.agent in self.engine.agents
            if served and self.policy.can_decide(principal, approval):
                return approval, is_open, store
        raise NotFoundError(f"Approval '{request.path_params['approval_id']}' not found.")

    async def show(self, request: Request) -> Response:
        try:
            principal = await self.authenticate(request)
            approval, is_open, store = await self._visible(request, principal)
            messages = await store.load_conversation(approval.turn_id)
            policy = await policy_wire(
                self.engine.agents[approval.agent], store, approval, principal
            )
            assignment = await current_assignment(self.engine.agents[approval.agent], approval)
        except AgentError as error:
            return error_response(error)
        item = _wire(approval, datetime.now(UTC), self.engine.agents)
        item["open"] = is_open
        item["policy"] = policy
        tool = self.engine.agents[approval.agent].tools.get(approval.interrupt)
        # Whether a decision may carry an "edit" of the call's arguments (engine.approvals.edits).
        item["editable"] = tool is not None and tool.editable and not tool.is_interrupt
        item["assignment"] = assignment_wire(assignment)
        item["messages"] = [m.to_wire() for m in messages]
        return JSONResponse(item)

    async def decision(self, request: Request) -> Response:
        try:
            principal = await self.authenticate(request)
            raw = await read_json(request, max_bytes=self.max_body_bytes)
            if not isinstance(raw, dict):
                raise InvalidArgumentError("A decision is a JSON object.")
            try:
                choice = Decision.model_validate(raw)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                    for e in exc.errors()[:5]
                )
                raise InvalidArgumentError(f"Invalid decision: {problems}.") from exc
            approval, is_open, _store = await self._visible(request, principal)
            if not is_open:
                raise ApprovalNotPendingError(
                    f"Approval '{approval_id(approval.turn_id, approval.ref)}' is no longer "
                    "pending: it was decided or answered already."
                )
            outcome = await decide(
                self.engine.agents[approval.agent],
                approval,
                choice,
                decided_by=principal.id if principal is not None else None,
                approver=principal,
            )
        except AgentError as error:
            return error_response(error)
        decided = outcome.decided
        return JSONResponse(
            {
                "id": approval_id(decided.turn_id, decided.ref),
                "decided": outcome.is_decided,
                "votes": [vote_wire(v) for v in outcome.votes],
                "decidedBy": decided.decided_by,
                "decidedAt": decided.decided_at.isoformat() if decided.decided_at else None,
                "resumeSnapshotId": outcome.resume_snapshot_id,
                "waitingFor": outcome.waiting_for,
            }
        )

    async def assignment(self, request: Request) -> Response:
        """``{"action": "claim" | "release" | "assign", "assignee": ..., "group": ...}``: 403
        when the caller may not act on the approval (or does not hold it, to release), 409
        when someone else holds it (claim) or it is no longer open."""
        try:
            principal = await self.authenticate(request)
            raw = await read_json(request, max_bytes=self.max_body_bytes)
            if not isinstance(raw, dict) or raw.get("action") not in ("claim", "release", "assign"):
                raise InvalidArgumentError(
                    "An assignment change is a JSON object with action 'claim', 'release' or "
                    "'assign'."
                )
            names = {}
            for field in ("assignee", "group"):
                value = raw.get(field)
                if value is not None and not isinstance(value, str):
                    raise InvalidArgumentError(f"{field} must be a string.")
                names[field] = check_id(value, field) if value else None
            approval, _is_open, _store = await self._visible(request, principal)
            agent = self.engine.agents[approval.agent]
            if raw["action"] == "claim":
                changed = await claim(agent, approval, principal)
            elif raw["action"] == "release":
                changed = await release(agent, approval, by=principal)
            else:
                changed = await assign(agent, approval, by=principal, **names)
        except AgentError as error:
            return error_response(error)
        return JSONResponse(
            {"id": approval_id(approval.turn_id, approval.ref), **assignment_wire(changed)}
        )
