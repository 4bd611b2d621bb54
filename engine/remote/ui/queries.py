"""What the pages read: approvals open and decided, turns, timelines, across the served stores.

An engine's agents may keep their turns in different stores; each page merges what every store
of the served agents returns, in one order, with keyset cursors (as ``GET /inbox`` does). What
a principal sees is what the :class:`~engine.remote.auth.InboxPolicy` lets it decide; a turn
is visible to its session's owner and to principals the policy lets see every approval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from engine.agent import Agent
from engine.approvals.assignment import assigned_matches, current_assignments, needs_quorum
from engine.approvals.decide import find_approval
from engine.engine import Engine
from engine.errors import InvalidArgumentError
from engine.remote.auth import InboxPolicy, Principal
from engine.remote.cursors import MAX_CURSOR_LENGTH, CursorKey, CursorSeal
from engine.remote.inbox_routes import gather_rows, served_stores, take_page
from engine.remote.wire import check_id, check_text
from engine.store import (
    ApprovalHistory,
    ApprovalQuery,
    Assignment,
    DecidedApproval,
    DecisionQuery,
    PendingApproval,
    SessionStore,
    ToolCallRecord,
    TurnRecord,
)

__all__ = [
    "AGE_CHOICES",
    "ASSIGNED_CHOICES",
    "ApprovalFound",
    "Catalog",
    "HistoryFilters",
    "InboxFilters",
    "Page",
    "TimelineRow",
    "TurnFound",
    "optional_id",
]

T = TypeVar("T")
Key = CursorKey

#: The inbox's age filter: at least this old (seconds, and what the list offers).
AGE_CHOICES: tuple[tuple[str, str], ...] = (
    ("", "Any age"),
    ("300", "Older than 5 minutes"),
    ("3600", "Older than 1 hour"),
    ("86400", "Older than 1 day"),
    ("604800", "Older than 1 week"),
)
_MAX_AGE_SECONDS = 10 * 365 * 86400
#: The inbox's assignment filter (the query's ``assigned`` value, and what the list offers).
ASSIGNED_CHOICES: tuple[tuple[str, str], ...] = (
    ("", "All I may decide"),
    ("me", "Assigned to me"),
    ("groups", "Assigned to my groups"),
    ("unassigned", "Unassigned"),
)
#: How far up a session's chain the page looks for the turn that continued another.
_MAX_CHAIN_STEPS = 500


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, and the cursor of the next (``None``: this is the last)."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class TimelineRow:
    """One thing that happened to a turn: when, what, on which attempt, by whom."""

    at: datetime
    kind: str
    detail: str
    attempt: int | None = None
    actor: str | None = None


@dataclass(frozen=True)
class ApprovalFound:
    """An approval, whether it is still open, its journal row and where it is kept."""

    approval: PendingApproval
    is_open: bool
    call: ToolCallRecord
    store: SessionStore
    agent: Agent


@dataclass(frozen=True)
class TurnFound:
    """A turn, the agent it belongs to, its store, and who owns its session."""

    turn: TurnRecord
    agent: Agent
    store: SessionStore
    owner: str | None


def optional_id(fields: Mapping[str, str], name: str, label: str) -> str | None:
    """The id in field ``name`` of a query string or form (``None`` when empty), checked as
    the wire checks ids (:class:`InvalidArgumentError` naming ``label``: a 400)."""
    value = fields.get(name, "").strip()
    if not value:
        return None
    check_text(value, label)
    return check_id(value, label)


def _cursor(params: Mapping[str, str]) -> str | None:
    value = params.get("cursor") or None
    # Opened by the catalog, which holds the seal; one too long to be ours is refused here.
    if value is not None and len(value) > MAX_CURSOR_LENGTH:
        raise InvalidArgumentError("The page cursor is not one this server handed out.")
    return value


@dataclass(frozen=True)
class _ListFilters:
    """What the inbox's and the history's filters share: agent, interrupt, requester, page."""

    agent: str | None = None
    interrupt: str | None = None
    requester: str | None = None
    cursor: str | None = None

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of these filters (with ``changes``), without empty values."""
        current = replace(self, **changes)
        values = {
            "agent": current.agent,
            "interrupt": current.interrupt,
            "requester": current.requester,
            **current._own_query(),
            "cursor": current.cursor,
        }
        return {k: v for k, v in values.items() if v}

    def _own_query(self) -> dict[str, str | None]:
        """The query values of the filters only this list has (between the shared ones and
        the cursor, the order links have always had)."""
        return {}


@dataclass(frozen=True)
class InboxFilters(_ListFilters):
    """The inbox's filters, order and page, as the query string gives them."""

    min_age: int = 0
    newest_first: bool = False
    #: ``me``, ``groups`` or ``unassigned`` (``None``: every approval the viewer may decide).
    assigned: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> InboxFilters:
        """Read and check the query string (:class:`InvalidArgumentError`: a 400)."""
        raw_age = params.get("age", "").strip()
        try:
            min_age = int(raw_age) if raw_age else 0
        except ValueError:
            raise InvalidArgumentError(
                f"age must be a number of seconds, not {raw_age!r}."
            ) from None
        if not 0 <= min_age <= _MAX_AGE_SECONDS:
            raise InvalidArgumentError("age must be between 0 and ten years, in seconds.")
        order = params.get("order", "oldest")
        if order not in ("oldest", "newest"):
            raise InvalidArgumentError("order must be 'oldest' or 'newest'.")
        assigned = params.get("assigned", "").strip() or None
        if assigned is not None and assigned not in ("me", "groups", "unassigned"):
            raise InvalidArgumentError("assigned must be 'me', 'groups' or 'unassigned'.")
        return cls(
            assigned=assigned,
            agent=optional_id(params, "agent", "The agent filter"),
            interrupt=optional_id(params, "interrupt", "The interrupt filter"),
            requester=optional_id(params, "requester", "The requester filter"),
            min_age=min_age,
            newest_first=order == "newest",
            cursor=_cursor(params),
        )

    def _own_query(self) -> dict[str, str | None]:
        return {
            "age": str(self.min_age) if self.min_age else None,
            "order": "newest" if self.newest_first else None,
            "assigned": self.assigned,
        }


@dataclass(frozen=True)
class HistoryFilters(_ListFilters):
    """The history's filters and page."""

    decided_by: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> HistoryFilters:
        """Read and check the query string (:class:`InvalidArgumentError`: a 400)."""
        return cls(
            agent=optional_id(params, "agent", "The agent filter"),
            interrupt=optional_id(params, "interrupt", "The interrupt filter"),
            requester=optional_id(params, "requester", "The requester filter"),
            decided_by=optional_id(params, "decided_by", "The decided-by filter"),
            cursor=_cursor(params),
        )

    def _own_query(self) -> dict[str, str | None]:
        return {"decided_by": self.decided_by}


def _pending_of(entry: DecidedApproval) -> PendingApproval:
    """A decided entry in the shape the inbox policy judges."""
    return PendingApproval(
        turn_id=entry.turn_id,
        session_id=entry.session_id,
        agent=entry.agent,
        owner=entry.owner,
        round=entry.round,
        interrupt=entry.interrupt,
        ref=entry.ref,
        input=entry.input,
        metadata=entry.metadata,
        created_at=entry.created_at or entry.decided_at,
    )


def _approval_key(approval: PendingApproval) -> Key:
    return approval.created_at, approval.turn_id, approval.ref


class Catalog:
    """The reads of the pages, over the stores of one engine's agents."""

    def __init__(self, engine: Engine, policy: InboxPolicy, cursors: CursorSeal) -> None:
        self.engine = engine
        self.policy = policy
        self.cursors = cursors

    # -- who sees what -------------------------------------------------------------------

    def may_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        """Whether ``principal`` may see and decide ``approval`` (an agent served here)."""
        return approval.agent in self.engine.agents and self.policy.can_decide(principal, approval)

    def may_view_turn(self, principal: Principal | None, owner: str | None) -> bool:
        """Whether ``principal`` may inspect a turn of a session owned by ``owner``."""
        return (
            principal is None
            or owner == principal.id
            or self.policy.owner_filter(principal) is None
        )

    def stores(self, agent: str | None = None) -> list[tuple[SessionStore, tuple[str, ...]]]:
        """Each store of the served agents (or of ``agent``), with the agents it holds."""
        return served_stores(self.engine.agents, agent)

    def agent_names(self) -> list[str]:
        """The served agents that keep turns in a store (the inbox's agent filter)."""
        return sorted(name for name, a in self.engine.agents.items() if a.store is not None)

    def interrupt_names(self) -> list[str]:
        """Every interrupt or tool of the served agents (the interrupt filter)."""
        return sorted({t for a in self.engine.agents.values() if a.store for t in a.tools})

    # -- open approvals ------------------------------------------------------------------

    def _approval_query(
        self, principal: Principal | None, filters: InboxFilters, now: datetime
    ) -> ApprovalQuery | None:
        allowed = self.policy.owner_filter(principal)
        if allowed is not None and filters.requester not in (None, allowed):
            return None
        return ApprovalQuery(
            interrupt=filters.interrupt,
            owner=filters.requester or allowed,
            created_before=now - timedelta(seconds=filters.min_age) if filters.min_age else None,
            after=self.cursors.open(filters.cursor) if filters.cursor else None,
            descending=filters.newest_first,
        )

    async def open_approvals(
        self, principal: Principal | None, filters: InboxFilters, *, limit: int = 50
    ) -> Page[PendingApproval]:
        """A page of the open approvals ``principal`` may decide."""
        query = self._approval_query(principal, filters, datetime.now(UTC))
        if query is None:
            return Page(items=[], next_cursor=None)

        held: dict[tuple[str, int, str], Assignment] = {}

        async def fetch(
            store: SessionStore, agents: tuple[str, ...], count: int
        ) -> list[PendingApproval]:
            rows = await store.list_approvals(
                query.model_copy(update={"agents": agents, "limit": count})
            )
            held.update(await current_assignments(self.engine.agents, rows))
            return rows

        def visible(approval: PendingApproval) -> bool:
            assignment = held[(approval.turn_id, approval.round, approval.ref)]
            quorum = needs_quorum(self.engine.agents.get(approval.agent), approval)
            return self.may_decide(principal, approval) and assigned_matches(
                principal, assignment, filters.assigned, quorum=quorum
            )

        rows, held_back = await gather_rows(
            self.stores(filters.agent),
            fetch,
            _approval_key,
            limit=limit,
            descending=filters.newest_first,
        )
        return Page(
            *take_page(
                rows,
                _approval_key,
                limit=limit,
                visible=visible,
                held_back=held_back,
                cursors=self.cursors,
            )
        )

    async def assignments(
        self, approvals: Sequence[PendingApproval]
    ) -> dict[tuple[str, int, str], Assignment]:
        """Who holds each of ``approvals`` now (see :mod:`engine.approvals.assignment`)."""
        return await current_assignments(self.engine.agents, approvals)

    async def count_open(
        self, principal: Principal | None, filters: InboxFilters, *, cap: int
    ) -> int:
        """How many open approvals ``principal`` may decide, counting up to ``cap``."""
        counted = 0
        cursor: str | None = None
        for _ in range(10):  # a bound on reads for a viewer who may decide few of many
            page = await self.open_approvals(
                principal, replace(filters, cursor=cursor, newest_first=False), limit=cap
            )
            counted += len(page.items)
            cursor = page.next_cursor
            if counted >= cap or cursor is None:
                break
        return min(counted, cap)

    # -- decided approvals ---------------------------------------------------------------

    async def decided_approvals(
        self, principal: Principal | None, filters: HistoryFilters, *, limit: int = 50
    ) -> Page[DecidedApproval]:
        """A page of the decided approvals ``principal`` may see, newest decision first."""
        allowed = self.policy.owner_filter(principal)
        if allowed is not None and filters.requester not in (None, allowed):
            return Page(items=[], next_cursor=None)
        query = DecisionQuery(
            interrupt=filters.interrupt,
            owner=filters.requester or allowed,
            decided_by=filters.decided_by,
            before=self.cursors.open(filters.cursor) if filters.cursor else None,
        )

        async def fetch(
            store: ApprovalHistory, agents: tuple[str, ...], count: int
        ) -> list[DecidedApproval]:
            return await store.list_decisions(
                query.model_copy(update={"agents": agents, "limit": count})
            )

        def key(entry: DecidedApproval) -> Key:
            return entry.key

        def visible(entry: DecidedApproval) -> bool:
            return self.may_decide(principal, _pending_of(entry))

        stores = self.stores(filters.agent)
        rows, held_back = await gather_rows(stores, fetch, key, limit=limit, descending=True)
        return Page(
            *take_page(
                rows, key, limit=limit, visible=visible, held_back=held_back, cursors=self.cursors
            )
        )

    # -- one approval, one turn ----------------------------------------------------------

    async def approval(
        self, principal: Principal | None, turn_id: str, ref: str
    ) -> ApprovalFound | None:
        """The approval ``ref`` of ``turn_id`` if ``principal`` may see it, else ``None``."""
        for store, _agents in self.stores():
            found = await find_approval(store, turn_id, ref)
            if found is None:
                continue
            approval, is_open = found
            if not self.may_decide(principal, approval):
                return None
            call = next(c for c in await store.list_calls(turn_id) if c.ref == ref and c.interrupt)
            agent = self.engine.agents[approval.agent]
            return ApprovalFound(approval, is_open, call, store, agent)
        return None

    async def turn(self, principal: Principal | None, turn_id: str) -> TurnFound | None:
        """The turn if it belongs to a served agent and ``principal`` may inspect it."""
        found = await self.find_turn(turn_id)
        if found is None or not self.may_view_turn(principal, found.owner):
            return None
        return found

    async def find_turn(self, turn_id: str) -> TurnFound | None:
        """The turn if it belongs to a served agent, whoever asks (callers check who may
        see it)."""
        for store, agents in self.stores():
            turn = await store.get_turn(turn_id)
            if turn is None or turn.agent not in agents:
                continue
            session = await store.get_session(turn.session_id)
            owner = session.owner if session is not None else None
            return TurnFound(turn, self.engine.agents[turn.agent], store, owner)
        return None


async def next_turn(store: SessionStore, turn: TurnRecord) -> TurnRecord | None:
    """The turn of the session that continued ``turn`` (its child on the session's current
    chain), or ``None`` while nothing did."""
    current = await store.latest_turn(turn.session_id)
    for _ in range(_MAX_CHAIN_STEPS):
        if current is None or current.id == turn.id:
            return None
        if current.parent_id == turn.id:
            return current
        if current.parent_id is None:
            return None
        current = await store.get_turn(current.parent_id)
    return None


async def timeline(store: SessionStore, turn_id: str) -> list[TimelineRow]:
    """Everything that happened to the turn, in order (the store's :class:`TurnTimeline`)."""
    return [
        TimelineRow(at=e.at, kind=e.kind, detail=e.detail, attempt=e.attempt, actor=e.actor)
        for e in await store.timeline(turn_id)
    ]
