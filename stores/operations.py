"""The operators' reads behind ``turnstile turns`` and ``turnstile stats``: turns by filter,
one turn with everything it holds, and the counts of the whole database.

The same SQLAlchemy Core statements run on PostgreSQL and SQLite. Listing reads ``turns``
newest first through ``ix_turns_created_at`` with the filters as conditions, the paused
turns through ``approval_queue`` (the waiting approvals of the rows shown come from it too,
one more statement); a turn's detail reuses the aggregates' reads (:mod:`stores.turns`,
:mod:`stores.messages`, :mod:`stores.tool_calls`). The counts read what is open through
its partial indexes; on PostgreSQL the settled statuses, which grow with history, come from
the planner's statistics of ``turns`` (an estimate, labelled so) unless an exact count is
asked for, which reads every turn (docs/cli.md, "turnstile stats").
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.engine import Connection

from engine.conversation.parts import Message
from engine.status import SETTLED_STATUSES, TurnStatus
from engine.store import (
    PAUSED,
    RoundRecord,
    ToolCallRecord,
    TurnQuery,
    TurnRecord,
    TurnRow,
    WaitingApproval,
)
from stores import messages as message_sql
from stores import tool_calls as call_sql
from stores import turns as turn_sql
from stores.database import record_from_row, utc
from stores.schema import (
    ACTIVE,
    TIMESTAMP,
    approval_queue,
    sessions,
    tool_calls,
    turns,
    ui_sessions,
)
from stores.turns import paused_now, stopped_at_approvals

__all__ = [
    "AGE_BUCKETS",
    "PAUSED",
    "ApprovalCounts",
    "OldestPending",
    "QueueCounts",
    "Stats",
    "TurnDetail",
    "TurnQuery",
    "TurnRow",
    "VersionCounts",
    "WaitingApproval",
    "approval_keys_starting",
    "id_prefixes",
    "ids_starting",
    "list_turns",
    "read_stats",
    "turn_detail",
]

#: The age buckets of open approvals: a label and the age (seconds) it starts at.
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<1h", 0.0),
    ("1h-1d", 3600.0),
    ("1d-7d", 86400.0),
    (">=7d", 7 * 86400.0),
)


class TurnDetail(BaseModel):
    """One turn with its conversation, its own rounds and journal, the turns that continue
    it, and the approvals it waits for."""

    turn: TurnRecord
    conversation: list[Message]
    rounds: list[RoundRecord]
    calls: list[ToolCallRecord]
    children: list[str]
    waiting: list[WaitingApproval]


class QueueCounts(BaseModel):
    """Running turns by what they wait for."""

    #: Pending, claimable now: waiting for a free worker slot.
    claimable: int = 0
    #: Pending, not claimable before their ``run_after`` (a retry's backoff).
    backing_off: int = 0
    #: Pending with a live lease: a worker runs them.
    running: int = 0
    #: Aborting: their worker is stopping them.
    aborting: int = 0


class OldestPending(BaseModel):
    """The pending turn created first."""

    turn_id: str
    agent: str
    created_at: datetime
    run_after: datetime


class ApprovalCounts(BaseModel):
    """Open approvals: undecided ones by age, and decided ones whose resume is not created
    yet (another approval of the same turn is still open)."""

    open: int = 0
    decided_waiting: int = 0
    by_age: dict[str, int] = Field(default_factory=lambda: {label: 0 for label, _ in AGE_BUCKETS})
    oldest_created_at: datetime | None = None


class VersionCounts(BaseModel):
    """The turns one application version still owes work to, for one agent: a version no
    worker serves shows claimable turns that never go down."""

    agent: str
    #: ``None``: turns created before definitions were pinned (any worker claims them).
    version: str | None
    #: Pending, claimable now (nobody holds them, their time has come).
    claimable: int = 0
    #: Paused at approvals now (their session's latest turn).
    paused: int = 0


class Stats(BaseModel):
    """The database at one moment."""

    at: datetime
    #: Turns per status (every status, zero included).
    turns: dict[str, int]
    #: The statuses whose count in ``turns`` is an estimate from PostgreSQL's statistics of
    #: the table (the settled ones, unless counted exactly); empty when every count is exact.
    estimated: list[str] = Field(default_factory=list)
    #: When those statistics were gathered (``ANALYZE``, by hand or by autovacuum), if known.
    analyzed_at: datetime | None = None
    #: Turns paused at approvals now: completed at interrupts and their session's latest
    #: (counted among ``completed``).
    paused: int
    queue: QueueCounts
    oldest_pending: OldestPending | None
    approvals: ApprovalCounts
    #: Claimable and paused turns by agent and application version.
    versions: list[VersionCounts] = Field(default_factory=list)


def _is_latest() -> sa.ColumnElement[bool]:
    """The turn is its session's latest (no turn of the session has a higher ``seq``)."""
    later = turns.alias("later")
    return ~sa.exists().where(later.c.session_id == turns.c.session_id, later.c.seq > turns.c.seq)


def _status_condition(status: str) -> sa.ColumnElement[bool]:
    if status == PAUSED:
        return paused_now()
    return turns.c.status == TurnStatus(status).value


def _conditions(query: TurnQuery) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if query.statuses and (len(query.statuses) > 1 or PAUSED in query.statuses):
        conditions.append(turns.c.id.in_(_any_status_page(query)))
    elif query.statuses:
        conditions.append(_status_condition(query.statuses[0]))
    if query.agent is not None:
        conditions.append(turns.c.agent == query.agent)
    if query.agents is not None:
        conditions.append(turns.c.agent.in_(query.agents))
    if query.session_id is not None:
        conditions.append(turns.c.session_id == query.session_id)
    if query.owner is not None:
        # Her sessions through ix_sessions_owner, then their turns by session: a requester's
        # page reads her turns, not the history of everyone's.
        owned = sa.select(sessions.c.id).where(sessions.c.owner == query.owner)
        conditions.append(turns.c.session_id.in_(owned))
    if query.app_version is not None:
        conditions.append(turns.c.app_version == query.app_version)
    if query.id_prefix is not None:
        conditions.append(_starts_with(turns.c.id, query.id_prefix, bytewise=True))
    if query.since is not None:
        conditions.append(turns.c.created_at >= query.since)
    if query.before is not None:
        seen_at, seen_id = query.before
        conditions.append(sa.tuple_(turns.c.created_at, turns.c.id) < (seen_at, seen_id))
    if query.latest_only:
        conditions.append(_is_latest())
    return conditions


def _paused_page(query: TurnQuery) -> sa.Subquery:
    """The ids of the page of paused turns ``query`` selects (its ``statuses`` aside), newest
    first: read from ``approval_queue`` through ``ix_approval_queue_turn_created_at``, which
    holds the paused turns in the listing's order, where ``ix_turns_created_at`` would also
    step over every turn paused and since resumed. A turn waiting for several approvals has
    one entry each, adjacent in that order; DISTINCT lists it once."""
    q = approval_queue.c
    # The range and the turn's own columns the queue copies, on the queue: its index scan
    # stops at the range's end, and skips other turns without reading them.
    on_queue: list[sa.ColumnElement[bool]] = []
    if query.agent is not None:
        on_queue.append(q.agent == query.agent)
    if query.agents is not None:
        on_queue.append(q.agent.in_(query.agents))
    if query.session_id is not None:
        on_queue.append(q.session_id == query.session_id)
    if query.since is not None:
        on_queue.append(q.turn_created_at >= query.since)
    if query.before is not None:
        seen_at, seen_id = query.before
        on_queue.append(sa.tuple_(q.turn_created_at, q.turn_id) < (seen_at, seen_id))
    return (
        sa.select(q.turn_created_at, q.turn_id.label("id"))
        .distinct()
        .select_from(approval_queue.join(turns, turns.c.id == q.turn_id))
        .where(stopped_at_approvals(), *on_queue, *_conditions(query))
        .order_by(q.turn_created_at.desc(), q.turn_id.desc())
        .limit(query.limit)
        .subquery()
    )


def _any_status_page(query: TurnQuery) -> sa.CompoundSelect[Any]:
    """The ids of the page of each status of ``query``, with its other filters: each is read
    through that status's own index, where one scan for any of them would filter its way
    through the turns of every other status."""
    others = query.model_copy(update={"statuses": None})
    pages = [
        _paused_page(others)
        if status == PAUSED
        else sa.select(turns.c.id)
        .where(_status_condition(status), *_conditions(others))
        .order_by(turns.c.created_at.desc(), turns.c.id.desc())
        .limit(query.limit)
        .subquery()
        for status in query.statuses or ()
    ]
    # Each page a subquery of its own: SQLite takes no LIMIT on a member of a UNION.
    return sa.union_all(*(sa.select(page.c.id) for page in pages))


def list_turns(connection: Connection, query: TurnQuery) -> list[TurnRow]:
    """The turns ``query`` selects, newest first, each with its waiting approvals."""
    t = turns.c
    rows = connection.execute(
        sa.select(
            t.id,
            t.session_id,
            t.seq,
            t.agent,
            t.parent_id,
            t.status,
            t.finish_reason,
            t.input["kind"].as_string().label("input_kind"),
            t.input["message"].label("message"),
            t.attempts,
            t.max_attempts,
            t.error,
            t.created_at,
            t.updated_at,
            t.settled_at,
            t.app_version,
            sessions.c.owner,
        )
        .select_from(turns.join(sessions, sessions.c.id == t.session_id))
        .where(*_conditions(query))
        .order_by(t.created_at.desc(), t.id.desc())
        .limit(query.limit)
    ).all()
    waiting = _waiting(connection, [r.id for r in rows])
    return [
        record_from_row(
            TurnRow,
            r,
            input_kind=str(r.input_kind),
            waiting=waiting.get(r.id, []),
            message_text=_text_of(r.message),
        )
        for r in rows
    ]


def _text_of(message: Any) -> str | None:
    """The text parts of a stored message, joined (``None``: no message, or no text)."""
    if not isinstance(message, dict):
        return None
    parts = message.get("content") or []
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return " ".join(" ".join(texts).split()) or None


def _waiting(connection: Connection, turn_ids: list[str]) -> dict[str, list[WaitingApproval]]:
    """The undecided open approvals of these turns, by turn, oldest first."""
    if not turn_ids:
        return {}
    q = approval_queue.c
    found: dict[str, list[WaitingApproval]] = {}
    for chunk in range(0, len(turn_ids), 500):
        rows = connection.execute(
            sa.select(q.turn_id, q.ref, q.name, q.created_at, q.input)
            .where(q.turn_id.in_(turn_ids[chunk : chunk + 500]), q.decided_at.is_(None))
            .order_by(q.created_at, q.turn_id, q.ref)
        )
        for r in rows:
            found.setdefault(r.turn_id, []).append(
                record_from_row(WaitingApproval, r, interrupt=r.name)
            )
    return found


def turn_detail(connection: Connection, turn_id: str) -> TurnDetail | None:
    """Everything one turn holds (``None``: no such turn)."""
    turn = turn_sql.get_turn(connection, turn_id)
    if turn is None:
        return None
    children = connection.execute(
        sa.select(turns.c.id).where(turns.c.parent_id == turn_id).order_by(turns.c.seq)
    ).scalars()
    return TurnDetail(
        turn=turn,
        conversation=message_sql.load_conversation(connection, turn_id) or [],
        rounds=message_sql.load_rounds(connection, turn_id),
        calls=call_sql.list_calls(connection, turn_id),
        children=list(children),
        waiting=_waiting(connection, [turn_id]).get(turn_id, []),
    )


# -- ids by prefix (an operator pastes the first characters of an id) -----------------------

#: The tables whose ids an operator may give by a prefix, by what they hold, each with whether
#: the column orders by bytes on both databases (turn and session ids: collation "C" on
#: PostgreSQL, migrations 0021 and 0024).
PREFIXED_IDS: dict[str, tuple[sa.Column[Any], bool]] = {
    "turn": (turns.c.id, True),
    "session": (sessions.c.id, True),
    "browser session": (ui_sessions.c.id, False),
}


def _prefixed_id(connection: Connection, kind: str) -> tuple[sa.Column[Any], bool]:
    """The id column of ``kind`` and whether it orders by bytes on this connection's database
    (on SQLite every text column does: its default collation compares bytes)."""
    column, bytewise = PREFIXED_IDS[kind]
    return column, bytewise or connection.dialect.name == "sqlite"


#: Prefixes of ids per statement of :func:`id_prefixes` (a condition each).
_PREFIXES_PER_READ = 100


def _starts_with(
    column: sa.ColumnElement[Any], prefix: str, *, bytewise: bool
) -> sa.ColumnElement[bool]:
    """``column`` starts with ``prefix``, every character taken literally; ``bytewise``: the
    column orders by bytes on both databases, so the prefix is also a range of its index."""
    # LIKE (its % and _ escaped) is what an index on the column can serve on PostgreSQL in
    # byte order; the substr comparison keeps the match exact where LIKE ignores case (SQLite).
    conditions = [
        column.startswith(prefix, autoescape=True),
        sa.func.substr(column, 1, len(prefix)) == prefix,
    ]
    if bytewise and prefix:
        # The range SQLite can read an index by, where its LIKE, ignoring case, reads none.
        # UTF-8 orders as the code points do, so the range ends at the last one's successor,
        # stepping over the surrogates, which have no encoding.
        following = ord(prefix[-1]) + 1
        following = 0xE000 if 0xD800 <= following <= 0xDFFF else following
        conditions.append(column >= prefix)
        if following <= 0x10FFFF:
            conditions.append(column < prefix[:-1] + chr(following))
    return sa.and_(*conditions)


def ids_starting(connection: Connection, kind: str, prefix: str, limit: int) -> list[str]:
    """The ids of ``kind`` (``turn``, ``session``, ``browser session``) that start with
    ``prefix``, in order, at most ``limit``; an id equal to ``prefix`` comes first."""
    column, bytewise = _prefixed_id(connection, kind)
    found = connection.execute(
        sa.select(column)
        .where(_starts_with(column, prefix, bytewise=bytewise))
        .order_by(column)
        .limit(limit)
    ).scalars()
    return sorted(found, key=lambda found_id: (found_id != prefix, found_id))


def approval_keys_starting(
    connection: Connection, turn_prefix: str, ref: str | None, limit: int
) -> list[tuple[str, str]]:
    """``(turn_id, ref)`` of the interrupts ever journaled on turns whose id starts with
    ``turn_prefix`` (only ref ``ref``, when given), in order, at most ``limit``; those of a
    turn whose id equals ``turn_prefix`` come first."""
    c = tool_calls.c
    conditions = [c.interrupt.is_not(None), _starts_with(c.turn_id, turn_prefix, bytewise=True)]
    if ref is not None:
        conditions.append(c.ref == ref)
    rows = connection.execute(
        sa.select(c.turn_id, c.ref)
        .where(*conditions)
        .group_by(c.turn_id, c.ref)
        .order_by(c.turn_id, c.ref)
        .limit(limit)
    ).all()
    keys = [(str(r.turn_id), str(r.ref)) for r in rows]
    return sorted(keys, key=lambda key: (key[0] != turn_prefix, key))


def id_prefixes(connection: Connection, kind: str, ids: list[str], shortest: int) -> dict[str, str]:
    """For each of ``ids`` (of ``kind``), its shortest prefix of at least ``shortest``
    characters that no other id of the table starts with (the id itself when every shorter
    prefix is shared)."""
    column, bytewise = _prefixed_id(connection, kind)
    heads = sorted({found_id[:shortest] for found_id in ids})
    neighbours: dict[str, list[str]] = {}
    for chunk in range(0, len(heads), _PREFIXES_PER_READ):
        # A prefix condition per head, not ``substr(id, 1, n) IN (...)``: each is a range of
        # the primary key, where the substr read every id of the table.
        starting = [
            _starts_with(column, head, bytewise=bytewise)
            for head in heads[chunk : chunk + _PREFIXES_PER_READ]
        ]
        rows = connection.execute(sa.select(column).where(sa.or_(*starting))).scalars()
        for found_id in rows:
            neighbours.setdefault(found_id[:shortest], []).append(found_id)
    prefixes: dict[str, str] = {}
    for found_id in ids:
        others = [o for o in neighbours.get(found_id[:shortest], []) if o != found_id]
        length = shortest
        while length < len(found_id) and any(o.startswith(found_id[:length]) for o in others):
            length += 1
        prefixes[found_id] = found_id[:length]
    return prefixes


_NOW = sa.bindparam("now", type_=TIMESTAMP)


def read_stats(connection: Connection, now: datetime, *, exact: bool = False) -> Stats:
    """Counts by status, the queue, the oldest pending turn and the open approvals by age,
    as of ``now``. On PostgreSQL, unless ``exact``, the settled statuses are estimated from
    the planner's statistics (:func:`_estimated_settled`); every other count is exact."""
    queue = _queue(connection, now)
    # The queue's classes split the pending turns (run_after is never null) and hold the
    # aborting ones: the open statuses counted through their partial index.
    by_status = {status.value: 0 for status in TurnStatus}
    by_status[TurnStatus.PENDING.value] = queue.claimable + queue.backing_off + queue.running
    by_status[TurnStatus.ABORTING.value] = queue.aborting
    estimated: list[str] = []
    analyzed_at: datetime | None = None
    settled = None if exact else _estimated_settled(connection, sum(by_status.values()))
    if settled is None:
        by_status = _counted_by_status(connection)
    else:
        counts, analyzed_at = settled
        by_status.update(counts)
        estimated = list(counts)
    # approval_queue holds the interrupted calls of exactly the paused, latest turns.
    paused = connection.execute(
        sa.select(sa.func.count(sa.distinct(approval_queue.c.turn_id)))
    ).scalar_one()
    return Stats(
        at=now,
        turns=by_status,
        estimated=estimated,
        analyzed_at=analyzed_at,
        paused=paused,
        queue=queue,
        oldest_pending=_oldest_pending(connection),
        approvals=_approvals(connection, now),
        versions=_versions(connection, now),
    )


def _counted_by_status(connection: Connection) -> dict[str, int]:
    """Every status's count, exactly: a read of all of ``turns``."""
    t = turns.c
    by_status = {status.value: 0 for status in TurnStatus}
    for row in connection.execute(
        sa.select(t.status, sa.func.count().label("total")).group_by(t.status)
    ):
        by_status[str(row.status)] += int(row.total)
    return by_status


#: The settled statuses, in the enum's order: what history is made of.
_SETTLED = [status.value for status in TurnStatus if status in SETTLED_STATUSES]

#: PostgreSQL's statistics of ``turns``: its rows when last vacuumed or analyzed, scaled to
#: the pages it has now (as the planner scales them), the most common statuses of the
#: sample with their shares, and when it was last analyzed. No row when it never was.
_TURN_STATISTICS = sa.text(
    """
    SELECT CASE WHEN c.relpages > 0
                THEN c.reltuples / c.relpages
                     * (pg_relation_size(c.oid) / current_setting('block_size')::int)
                ELSE c.reltuples END AS total,
           s.most_common_vals::text::text[] AS statuses,
           s.most_common_freqs AS shares,
           greatest(a.last_analyze, a.last_autoanalyze) AS analyzed_at
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
                   AND s.attname = 'status' AND NOT s.inherited
    LEFT JOIN pg_stat_user_tables a ON a.relid = c.oid
    WHERE c.oid = to_regclass(:turns) AND c.reltuples >= 0
          AND s.most_common_vals IS NOT NULL
    """
)


def _estimated_settled(
    connection: Connection, open_turns: int
) -> tuple[dict[str, int], datetime | None] | None:
    """The settled statuses' counts estimated from PostgreSQL's statistics of ``turns``, and
    when they were gathered; ``None`` on SQLite, or when ``turns`` was never analyzed (it
    is then new or small, and counting it is cheap)."""
    if connection.dialect.name != "postgresql":
        return None
    row = connection.execute(_TURN_STATISTICS, {"turns": turns.name}).first()
    if row is None:
        return None
    total = float(row.total)
    shares = dict(zip(row.statuses, row.shares, strict=True))
    counts = {status: round(shares[status] * total) for status in _SETTLED if status in shares}
    # A status too rare to be among the sample's most common shares what the listed ones
    # and the open turns leave.
    unlisted = [status for status in _SETTLED if status not in shares]
    rest = max(0.0, total - open_turns - sum(counts.values()))
    for status in unlisted:
        counts[status] = round(rest / len(unlisted))
    return {status: counts[status] for status in _SETTLED}, utc(row.analyzed_at)


def _versions(connection: Connection, now: datetime) -> list[VersionCounts]:
    """Claimable and paused turns per (agent, version): the pending turns, and the paused
    ones counted in ``approval_queue`` alone (the turns ever paused and since resumed are most
    of history, and a read of them would grow with it)."""
    t = turns.c
    claimable = sa.and_(
        t.run_after <= _NOW,
        sa.or_(t.lease_expires_at.is_(None), t.lease_expires_at < _NOW),
    )
    pending = sa.select(
        t.agent,
        t.app_version,
        sa.case((claimable, 1), else_=0).label("claimable"),
        sa.literal(0).label("paused"),
    ).where(t.status == TurnStatus.PENDING.value)
    # The queue holds exactly the paused turns' calls, with each turn's agent and version
    # copied (0022): one row per paused turn, without reading ``turns``.
    q = approval_queue.c
    paused_turns = (
        sa.select(q.turn_id, q.agent, q.turn_app_version).distinct().subquery("paused_turns")
    )
    paused = sa.select(
        paused_turns.c.agent,
        paused_turns.c.turn_app_version.label("app_version"),
        sa.literal(0).label("claimable"),
        sa.literal(1).label("paused"),
    )
    waiting = sa.union_all(pending, paused).subquery("waiting")
    w = waiting.c
    rows = connection.execute(
        sa.select(
            w.agent,
            w.app_version,
            sa.func.sum(w.claimable).label("claimable"),
            sa.func.sum(w.paused).label("paused"),
        )
        .group_by(w.agent, w.app_version)
        .order_by(w.agent, w.app_version),
        {"now": now},
    )
    counts = [
        VersionCounts(
            agent=row.agent,
            version=row.app_version,
            claimable=int(row.claimable or 0),
            paused=int(row.paused or 0),
        )
        for row in rows
    ]
    return [c for c in counts if c.claimable or c.paused]


def _queue(connection: Connection, now: datetime) -> QueueCounts:
    t = turns.c
    leased = sa.and_(t.lease_expires_at.is_not(None), t.lease_expires_at >= _NOW)
    pending = t.status == TurnStatus.PENDING.value

    def count(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
        return sa.func.coalesce(sa.func.sum(sa.case((condition, 1), else_=0)), 0)

    row = connection.execute(
        sa.select(
            count(sa.and_(pending, ~leased, t.run_after <= _NOW)).label("claimable"),
            count(sa.and_(pending, ~leased, t.run_after > _NOW)).label("backing_off"),
            count(sa.and_(pending, leased)).label("running"),
            count(t.status == TurnStatus.ABORTING.value).label("aborting"),
        ).where(t.status.in_(ACTIVE)),
        {"now": now},
    ).one()
    return QueueCounts(
        claimable=int(row.claimable),
        backing_off=int(row.backing_off),
        running=int(row.running),
        aborting=int(row.aborting),
    )


def _oldest_pending(connection: Connection) -> OldestPending | None:
    t = turns.c
    row = connection.execute(
        sa.select(t.id, t.agent, t.created_at, t.run_after)
        .where(t.status == TurnStatus.PENDING.value)
        .order_by(t.created_at, t.id)
        .limit(1)
    ).first()
    if row is None:
        return None
    return OldestPending(
        turn_id=row.id,
        agent=row.agent,
        created_at=utc(row.created_at),
        run_after=utc(row.run_after),
    )


def _approvals(connection: Connection, now: datetime) -> ApprovalCounts:
    q = approval_queue.c
    undecided = q.decided_at.is_(None)
    # Each bucket's bounds as bound moments: the same comparison on both databases.
    bounds = [now - timedelta(seconds=start) for _, start in AGE_BUCKETS] + [None]
    buckets = []
    for index, (label, _) in enumerate(AGE_BUCKETS):
        newest, oldest = bounds[index], bounds[index + 1]
        within: list[sa.ColumnElement[bool]] = [undecided]
        if index > 0:  # the youngest bucket also takes moments ahead of this clock
            within.append(q.created_at <= newest)
        if oldest is not None:
            within.append(q.created_at > oldest)
        buckets.append(sa.func.sum(sa.case((sa.and_(*within), 1), else_=0)).label(label))
    row = connection.execute(
        sa.select(
            sa.func.sum(sa.case((undecided, 1), else_=0)).label("open"),
            sa.func.sum(sa.case((undecided, 0), else_=1)).label("decided"),
            sa.func.min(sa.case((undecided, q.created_at), else_=None)).label("oldest"),
            *buckets,
        )
    ).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite: a CASE hides the column's type
        oldest = datetime.fromisoformat(oldest)
    mapping = row._mapping
    return ApprovalCounts(
        open=int(row.open or 0),
        decided_waiting=int(row.decided or 0),
        by_age={label: int(mapping[label] or 0) for label, _ in AGE_BUCKETS},
        oldest_created_at=utc(oldest),
    )
