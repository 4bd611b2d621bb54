"""The runs page: turns of the served agents, newest first, found by filters and an id prefix.

A requester sees the turns of the sessions she owns; a principal the inbox policy lets see
every approval (an operator, ``owner_filter`` is ``None``) sees every turn, and may narrow the
list to one requester's. Each store of the served agents is read through its
:class:`~engine.store.TurnListing` (the read behind ``turnstile turns ls``), and the pages are
merged and keyset-paged with sealed cursors, as the inbox's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidArgumentError
from engine.remote.auth import Principal
from engine.remote.cursors import CursorKey
from engine.remote.inbox_routes import gather_rows, take_page
from engine.remote.ui import present
from engine.remote.ui.kit import PageKit, Viewer, query_of
from engine.remote.ui.queries import Catalog, Page, optional_id
from engine.remote.wire import MAX_ID_LENGTH, check_text
from engine.status import TurnStatus
from engine.store import PAUSED, SessionStore, TurnQuery, TurnRow

__all__ = [
    "RUN_AGE_CHOICES",
    "STATUS_CHOICES",
    "RunFilters",
    "RunsPages",
    "find_runs",
    "status_words",
]

PAGE_SIZE = 50
#: The status filter's values and what the list offers (``paused``: waiting at approvals).
STATUS_CHOICES: tuple[tuple[str, str], ...] = (
    ("", "Any status"),
    (PAUSED, "Paused (waiting for approval)"),
    *((status.value, status.value.capitalize()) for status in TurnStatus),
)
#: The age filter: created at most this long ago (seconds, and what the list offers).
RUN_AGE_CHOICES: tuple[tuple[str, str], ...] = (
    ("", "Any time"),
    ("3600", "In the last hour"),
    ("86400", "In the last day"),
    ("604800", "In the last week"),
    ("2592000", "In the last 30 days"),
)
_MAX_AGE_SECONDS = 10 * 365 * 86400


@dataclass(frozen=True)
class RunFilters:
    """The runs page's filters and page, as the query string gives them."""

    status: str | None = None
    agent: str | None = None
    version: str | None = None
    requester: str | None = None
    session: str | None = None
    #: The first characters of a turn id.
    prefix: str | None = None
    #: Only turns created at most this many seconds ago (0: any).
    max_age: int = 0
    cursor: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> RunFilters:
        """Read and check the query string (:class:`InvalidArgumentError`: a 400)."""
        status = params.get("status", "").strip() or None
        if status is not None and status not in dict(STATUS_CHOICES):
            choices = ", ".join(value for value, _ in STATUS_CHOICES if value)
            raise InvalidArgumentError(f"status must be one of {choices}.")
        raw_age = params.get("age", "").strip()
        if raw_age and not (raw_age.isascii() and raw_age.isdigit()):
            raise InvalidArgumentError(f"age must be a number of seconds, not {raw_age[:40]!r}.")
        # Digits past twelve are already more than ten years: refused before int() reads them.
        if len(raw_age) > 12 or (raw_age and int(raw_age) > _MAX_AGE_SECONDS):
            raise InvalidArgumentError("age must be between 0 and ten years, in seconds.")
        prefix = params.get("q", "").strip() or None
        if prefix is not None:
            check_text(prefix, "The id search")
            if len(prefix) > MAX_ID_LENGTH:
                raise InvalidArgumentError(
                    f"The id search is too long ({len(prefix)} characters; "
                    f"ids have at most {MAX_ID_LENGTH})."
                )
        return cls(
            status=status,
            agent=optional_id(params, "agent", "The agent filter"),
            version=optional_id(params, "version", "The version filter"),
            requester=optional_id(params, "requester", "The requester filter"),
            session=optional_id(params, "session", "The session filter"),
            prefix=prefix,
            max_age=int(raw_age) if raw_age else 0,
            # Opened by the catalog's seal, which refuses one it did not hand out (a 400).
            cursor=params.get("cursor") or None,
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of these filters (with ``changes``), without empty values."""
        current = replace(self, **changes)
        values = {
            "q": current.prefix,
            "status": current.status,
            "agent": current.agent,
            "version": current.version,
            "requester": current.requester,
            "session": current.session,
            "age": str(current.max_age) if current.max_age else None,
            "cursor": current.cursor,
        }
        return {k: v for k, v in values.items() if v}


def _key(row: TurnRow) -> CursorKey:
    # The session id only fills the cursor's third place: turn ids alone order the ties.
    return row.created_at, row.id, row.session_id


async def find_runs(
    catalog: Catalog, principal: Principal | None, filters: RunFilters, *, limit: int = PAGE_SIZE
) -> Page[TurnRow]:
    """A page of the turns ``principal`` may see that ``filters`` select, newest first: a
    requester's own (whatever requester she names), an operator's any."""
    allowed = catalog.policy.owner_filter(principal)
    before = catalog.cursors.open(filters.cursor) if filters.cursor else None
    since = None
    if filters.max_age:
        since = datetime.now(UTC) - timedelta(seconds=filters.max_age)
    query = TurnQuery(
        statuses=(filters.status,) if filters.status else None,
        session_id=filters.session,
        owner=allowed if allowed is not None else filters.requester,
        app_version=filters.version,
        id_prefix=filters.prefix,
        since=since,
        before=(before[0], before[1]) if before else None,
    )

    async def fetch(store: SessionStore, agents: tuple[str, ...], count: int) -> list[TurnRow]:
        return await store.list_turns(query.model_copy(update={"agents": agents, "limit": count}))

    rows, held_back = await gather_rows(
        catalog.stores(filters.agent), fetch, _key, limit=limit, descending=True
    )
    items, next_cursor = take_page(
        rows,
        _key,
        limit=limit,
        visible=lambda row: catalog.may_view_turn(principal, row.owner),
        held_back=held_back,
        cursors=catalog.cursors,
    )
    return Page(items=items, next_cursor=next_cursor)


def status_words(row: TurnRow) -> str:
    """The turn's state in words: a paused turn says whether it still waits."""
    return present.turn_state(
        row.status.value,
        row.finish_reason.value if row.finish_reason else None,
        continued=not row.waiting,
    )


def _asks(interrupt: str, value: Any) -> str:
    """What an open approval asks, as the inbox summarises its input."""
    text = present.input_summary(value)
    return f"{interrupt}: {text}" if text else interrupt


class RunsPages:
    """``GET /ui/runs``."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    async def runs(self, request: Request, viewer: Viewer) -> Response:
        """A page of runs, newest first, with the filters that found them."""
        filters = RunFilters.from_query(query_of(request))
        catalog = self.kit.catalog
        page = await find_runs(catalog, viewer.principal, filters)
        now = datetime.now(UTC)
        rows = [
            {
                "turn": row,
                "status": status_words(row),
                "summary": row.about(_asks),
                "age": present.ago(row.created_at, now),
            }
            for row in page.items
        ]
        context = {
            "nav": "runs",
            "filters": filters,
            "rows": rows,
            "own_only": catalog.policy.owner_filter(viewer.principal) is not None,
            "agents": catalog.agent_names(),
            "statuses": STATUS_CHOICES,
            "ages": RUN_AGE_CHOICES,
            "next_query": filters.query(cursor=page.next_cursor) if page.next_cursor else None,
            "first_query": filters.query(cursor=None) if filters.cursor else None,
            "filtered": bool(filters.query(cursor=None)),
        }
        return self.kit.page(request, viewer, "runs.html", context)
