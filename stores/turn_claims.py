"""SQL for claiming turns: the claim statement, its one-round-trip form, and the recovery of
aborts whose worker died.

A claim leases the oldest claimable turns, ``FOR UPDATE SKIP LOCKED`` so that concurrent
workers take different rows without waiting on one another. A turn whose lease expired (its
worker died) is claimable again through the same query: recovery is part of claiming. On
SQLite the transaction's ``BEGIN IMMEDIATE`` serialises claimers instead.

A claim also writes each leased turn's history entries (``claimed``, and ``lease lost`` when
it takes over the lease of a worker that died) and returns each turn with its progress
(:class:`~engine.store.ClaimedTurn`), so the worker reads nothing before its first model call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from engine.status import TurnStatus
from engine.store import ClaimedTurn, FollowOnClaim, TurnRecord
from engine.store.history import CLAIMED, LEASE_LOST, claim_entries
from engine.store.rules import ABANDONED_ABORT
from stores import snapshots as snapshot_sql
from stores.history import append_history
from stores.pg import PgConnections, PgStatement
from stores.schema import TIMESTAMP, turn_events, turns
from stores.snapshots import progress_of, progress_of_turn
from stores.turns import record, transition

__all__ = [
    "CLAIMED_PROGRESS",
    "CheckedClaim",
    "ClaimRequest",
    "checked_claim_of",
    "checked_claim_queries",
    "claim",
    "claim_checking_abandoned",
    "claim_statement",
    "lease_created",
    "noting_leased",
    "settle_abandoned",
]


def _due(now: datetime | sa.BindParameter[datetime]) -> sa.ColumnElement[bool]:
    """Its time has come and nobody holds it (a claimable turn, status aside)."""
    return sa.and_(
        turns.c.run_after <= now,
        sa.or_(turns.c.lease_expires_at.is_(None), turns.c.lease_expires_at < now),
    )


def _claimable(now: datetime | sa.BindParameter[datetime]) -> sa.ColumnElement[bool]:
    return sa.and_(turns.c.status == TurnStatus.PENDING.value, _due(now))


@dataclass(frozen=True)
class ClaimRequest:
    """What a claim asks for: up to ``limit`` turns for ``owner``, leased for
    ``lease_seconds`` from ``now``; only of ``agents``, only ``turn_ids`` and only turns
    pinned to one of ``versions`` (or to none) when given."""

    owner: str
    lease_seconds: float
    now: datetime
    limit: int
    agents: Collection[str] | None = None
    turn_ids: Collection[str] | None = None
    versions: Collection[str] | None = None

    @classmethod
    def of(cls, claim: FollowOnClaim, now: datetime) -> ClaimRequest:
        """The request of a settling transition's follow-on claim."""
        return cls(
            owner=claim.owner,
            lease_seconds=claim.lease_seconds,
            now=now,
            limit=claim.limit,
            agents=claim.agents,
            versions=claim.versions,
        )

    @property
    def form(self) -> tuple[bool, bool, bool]:
        """Which statement serves it: (filtered by agents, limited to named turns, filtered
        by versions)."""
        return self.agents is not None, self.turn_ids is not None, self.versions is not None

    def params(self) -> dict[str, Any]:
        """The statement's parameters."""
        params: dict[str, Any] = {
            "now": self.now,
            "expires": self.now + timedelta(seconds=self.lease_seconds),
            "owner": self.owner,
            "limit": self.limit,
        }
        if self.agents is not None:
            params["agents"] = list(self.agents)
        if self.turn_ids is not None:
            params["turn_ids"] = list(self.turn_ids)
        if self.versions is not None:
            params["versions"] = list(self.versions)
        return params


def claim_statement(request: ClaimRequest) -> sa.Select[Any]:
    """The claim PostgreSQL runs for ``request`` with its history entries (the statement of
    :func:`claim_checking_abandoned` without its recovery check), its values bound (for
    callers that compile it, e.g. to EXPLAIN it)."""
    agents, turn_ids, versions = request.form
    return _claim_statement(
        agents=agents, turn_ids=turn_ids, versions=versions, values=request.params()
    )


def claim(connection: Connection, request: ClaimRequest) -> list[ClaimedTurn]:
    """Lease the claimable turns ``request`` asks for, oldest ``run_after`` first, with their
    history entries and their progress, in a transaction (the SQLite path; PostgreSQL uses
    :func:`claim_checking_abandoned`).

    First settles ``aborting`` turns whose worker died (lease expired): nobody else would,
    and their session would stay busy forever. Recovery stays part of claiming.
    """
    settle_abandoned(connection, request.now, request.limit)
    params = request.params()
    before = [record(r) for r in connection.execute(_CANDIDATES[request.form], params)]
    return _lease_found(connection, before, params)


def lease_created(
    connection: Connection, created: TurnRecord, request: ClaimRequest
) -> ClaimedTurn:
    """Lease the turn the caller's transaction just created to its creator, as a claim
    would (the SQLite form of a claimed creation; PostgreSQL's creation statement leases
    the row it inserts)."""
    (claimed,) = _lease_found(connection, [created], request.params())
    return claimed


def _lease_found(
    connection: Connection, before: Sequence[TurnRecord], params: Mapping[str, Any]
) -> list[ClaimedTurn]:
    """Lease exactly ``before`` (locked by the caller's transaction), append each one's
    history entries and read its progress."""
    if not before:
        return []
    leased = connection.execute(_LEASE, {**params, "ids": [t.id for t in before]})
    after = {turn.id: turn for turn in map(record, leased)}
    claimed = []
    for turn in before:
        taken = after[turn.id]
        for entry in claim_entries(turn, taken):
            append_history(connection, turn.id, entry)
        claimed.append(ClaimedTurn(turn=taken, progress=progress_of_turn(connection, taken)))
    return claimed


@dataclass(frozen=True)
class CheckedClaim:
    """What :func:`claim_checking_abandoned` found."""

    #: The leased turns with their progress, oldest ``run_after`` first.
    turns: list[ClaimedTurn]
    #: Whether an ``aborting`` turn whose worker died waits for :func:`settle_abandoned`.
    abandoned: bool


async def claim_checking_abandoned(pg: PgConnections, request: ClaimRequest) -> CheckedClaim:
    """The claim as one autocommit round trip and transaction (PostgreSQL): the claim
    statement, which leases the turns, writes their history entries and says whether an
    ``aborting`` turn whose worker died is waiting to be settled (rare; the caller runs
    :func:`settle_abandoned` in its own transaction), then the read of each leased turn's
    progress.

    One round trip instead of six (``BEGIN``, the recovery read, the claim, ``COMMIT``, then
    the worker's read of the progress): the claim sits on the path from a resume to its
    first model call. ``SKIP LOCKED`` keeps concurrent claimers apart.
    """
    return checked_claim_of(*await pg.fetch_together(checked_claim_queries(request)))


def checked_claim_queries(request: ClaimRequest) -> list[tuple[PgStatement, dict[str, Any]]]:
    """The statements and values of :func:`claim_checking_abandoned`, for a caller that runs
    them in one transaction after statements of its own; :func:`checked_claim_of` reads
    their rows.

    Why the progress is a statement of its own: in READ COMMITTED a statement reads with
    the snapshot taken when it started. A fenced write of the turn's previous holder (a
    worker that stalled past its lease, its token valid until this claim) can commit after
    the claim's snapshot and before the claim locks the row; read by the claim statement,
    the progress would miss that write, and the new holder would ask the model again for a
    round whose tool call had started. The next statement's snapshot is taken after the
    lock, and from the lock on no write under the old token can commit (its fence waits for
    the lock, then finds the new token).
    """
    return [(_CHECKED_CLAIMS[request.form], request.params()), (CLAIMED_PROGRESS, {})]


def checked_claim_of(
    claim_rows: Sequence[Mapping[str, Any]], progress_rows: Sequence[Mapping[str, Any]]
) -> CheckedClaim:
    """What the rows of the checked claim's two statements say."""
    progress = {row["id"]: progress_of(row) for row in progress_rows}
    claimed: list[ClaimedTurn] = []
    abandoned = False
    for row in claim_rows:
        abandoned = abandoned or bool(row["abandoned"])
        if row["id"] is not None:  # the one row of an empty claim has no turn
            claimed.append(ClaimedTurn(turn=record(row), progress=progress[row["id"]]))
    claimed.sort(key=lambda c: (c.turn.run_after, c.turn.id))
    return CheckedClaim(turns=claimed, abandoned=abandoned)


def settle_abandoned(connection: Connection, now: datetime, limit: int) -> None:
    """Settle ``aborted`` the ``aborting`` turns whose lease expired (their worker died)."""
    abandoned = connection.execute(_ABANDONED, {"now": now, "limit": limit}).scalars().all()
    for abandoned_id in abandoned:
        transition(connection, abandoned_id, ABANDONED_ABORT, now)


_ABANDONED = (
    sa.select(turns.c.id)
    .where(
        turns.c.status == TurnStatus.ABORTING.value,
        turns.c.lease_expires_at < sa.bindparam("now", type_=TIMESTAMP),
    )
    .limit(sa.bindparam("limit", type_=sa.Integer))
    .with_for_update(skip_locked=True)
)


def _binder(values: dict[str, Any] | None) -> Callable[..., sa.BindParameter[Any]]:
    """Bound parameters by name: carrying their value from ``values`` when given, else left
    for the execution to supply."""

    def param(name: str, **kwargs: Any) -> sa.BindParameter[Any]:
        if values is None:
            return sa.bindparam(name, **kwargs)
        return sa.bindparam(name, values[name], **kwargs)

    return param


def _candidates(
    *,
    agents: bool,
    turn_ids: bool,
    versions: bool,
    arrays: bool,
    columns: Sequence[sa.ColumnElement[Any]],
    values: dict[str, Any] | None = None,
) -> sa.Select[Any]:
    """The turns a claim leases, locked (``FOR UPDATE SKIP LOCKED``) and read as they were
    before it: ``columns`` of the oldest claimable turns, with bound parameters ``now`` and
    ``limit``, and ``agents``/``turn_ids``/``versions`` when used. With ``arrays``
    (PostgreSQL) the lists are one array parameter each (``= ANY(…)``), so the statement's
    text does not depend on their length."""
    param = _binder(values)

    def one_of(column: sa.Column[Any], name: str) -> sa.ColumnElement[bool]:
        if arrays:
            return column == sa.any_(param(name, type_=ARRAY(sa.Text)))
        return column.in_(param(name, expanding=True))

    now = param("now", type_=TIMESTAMP)
    if turn_ids:
        # Only the named turns (a work notification's ids, or claim_turn's one turn), found
        # by primary key. The status is compared as text so that the claim index cannot
        # serve this query: the planner, which believes that small partial index holds only
        # the pending turns, would scan all of it (with every dead entry left since the last
        # vacuum) and filter on the ids — the very scan naming the turns avoids.
        candidates = sa.select(*columns).where(
            one_of(turns.c.id, "turn_ids"),
            sa.cast(turns.c.status, sa.Text) == TurnStatus.PENDING.value,
            _due(now),
        )
    else:
        candidates = sa.select(*columns).where(_claimable(now))
    if agents:
        candidates = candidates.where(one_of(turns.c.agent, "agents"))
    if versions:
        # Turns created before definitions were pinned carry no version: anyone runs them.
        candidates = candidates.where(
            sa.or_(turns.c.app_version.is_(None), one_of(turns.c.app_version, "versions"))
        )
    return (
        candidates.order_by(turns.c.run_after, turns.c.id)
        .limit(param("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )


def _leases(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a claim sets on each turn it leases."""
    param = _binder(values)
    return {
        "lease_owner": param("owner"),
        "lease_expires_at": param("expires", type_=TIMESTAMP),
        "lease_token": turns.c.lease_token + 1,
        "attempts": turns.c.attempts + 1,
        "updated_at": param("now", type_=TIMESTAMP),
    }


# SQLite: the candidates as whole rows (what their history entries need of them before the
# lease), then the lease of exactly those.
_CANDIDATES = {
    (agents, turn_ids, versions): _candidates(
        agents=agents, turn_ids=turn_ids, versions=versions, arrays=False, columns=list(turns.c)
    )
    for agents in (False, True)
    for turn_ids in (False, True)
    for versions in (False, True)
}

_LEASE = (
    sa.update(turns)
    .where(turns.c.id.in_(sa.bindparam("ids", expanding=True)))
    .values(**_leases())
    .returning(turns)
)


def _history_entries(claimed: sa.CTE) -> sa.Insert:
    """The INSERT of the ``claimed`` rows' history entries: the words of
    :func:`engine.store.history.claim_entries`, in SQL. ``claimed`` carries each turn's
    lease owner, attempt and lease expiry from before the claim (``lost_owner``,
    ``lost_attempt``, ``lost_until``): a claim only finds a lease owner left on a turn whose
    worker died, and its entry comes first."""
    text = sa.Text

    def words(*parts: Any) -> sa.ColumnElement[str]:
        return sa.func.concat(
            *(
                sa.cast(p, text) if isinstance(p, sa.ColumnElement) else sa.literal(p, text)
                for p in parts
            )
        )

    lost = sa.select(
        claimed.c.id.label("turn_id"),
        claimed.c.status.label("to_status"),
        sa.literal(LEASE_LOST, text).label("kind"),
        claimed.c.lost_attempt.label("attempt"),
        claimed.c.lost_owner.label("actor"),
        words(
            "lease of ", claimed.c.lost_owner, " expired (attempt ", claimed.c.lost_attempt, ")"
        ).label("note"),
        sa.func.coalesce(claimed.c.lost_until, claimed.c.updated_at).label("at"),
        sa.literal(0, sa.Integer).label("step"),
    ).where(claimed.c.lost_owner.is_not(None))
    took = sa.select(
        claimed.c.id,
        claimed.c.status,
        sa.literal(CLAIMED, text),
        claimed.c.attempts,
        claimed.c.lease_owner,
        words("claimed by ", claimed.c.lease_owner, " (attempt ", claimed.c.attempts, ")"),
        claimed.c.updated_at,
        sa.literal(1, sa.Integer),
    )
    entries = sa.union_all(lost, took).subquery("entry")
    names = ["turn_id", "to_status", "kind", "attempt", "actor", "note", "at"]
    return sa.insert(turn_events).from_select(
        names,
        # In entry order (a lease lost before its claim): the ids follow it.
        sa.select(*(entries.c[name] for name in names)).order_by(entries.c.turn_id, entries.c.step),
    )


def _leased(
    *, agents: bool, turn_ids: bool, versions: bool, values: dict[str, Any] | None = None
) -> sa.CTE:
    """The claim as data-modifying CTEs: the candidates read and locked, then the lease of
    each (``claimed``, carrying what the candidate held before, for its history entries)."""
    candidates = _candidates(
        agents=agents,
        turn_ids=turn_ids,
        versions=versions,
        arrays=True,
        columns=[turns.c.id, turns.c.lease_owner, turns.c.attempts, turns.c.lease_expires_at],
        values=values,
    ).cte("candidates")
    return (
        sa.update(turns)
        .where(turns.c.id == candidates.c.id)
        .values(**_leases(values))
        .returning(
            *turns.c,
            candidates.c.lease_owner.label("lost_owner"),
            candidates.c.attempts.label("lost_attempt"),
            candidates.c.lease_expires_at.label("lost_until"),
        )
        .cte("claimed")
    )


def _claim_statement(
    *, agents: bool, turn_ids: bool, versions: bool, values: dict[str, Any] | None = None
) -> sa.Select[Any]:
    """The claim and its history entries, returning the leased turns."""
    claimed = _leased(agents=agents, turn_ids=turn_ids, versions=versions, values=values)
    # Not read by name: a data-modifying CTE runs whether or not the query reads it.
    history = _history_entries(claimed).cte("history")
    return sa.select(*(claimed.c[column.name] for column in turns.c)).add_cte(history)


#: The transaction-local setting through which the checked claim tells the progress read
#: after it which turns it leased (a text array literal of their ids): the two statements
#: are sent together, before either has run, so no parameter can carry them.
_CLAIMED_SETTING = "turnstile.claimed"


def noting_leased(ids: sa.ColumnElement[Any]) -> sa.ColumnElement[str]:
    """The expression by which a statement leasing turns (a claim, a claimed creation) tells
    :data:`CLAIMED_PROGRESS`, run next in its transaction, which turns it leased: ``ids`` is
    a text array of their ids (NULL: none, noted as an empty array, not an empty setting)."""
    return sa.func.set_config(
        _CLAIMED_SETTING, sa.func.coalesce(sa.cast(ids, sa.Text), "{}"), sa.true()
    )


def _checked_claim(*, agents: bool, turn_ids: bool, versions: bool) -> PgStatement:
    """The claim (:func:`_claim_statement`) left-joined to one row, so that an empty claim
    still answers the recovery question (``abandoned``: an index probe on the partial
    index ``ix_turns_aborting``), and noting the leased ids for :data:`CLAIMED_PROGRESS`."""
    claimed = _leased(agents=agents, turn_ids=turn_ids, versions=versions)
    history = _history_entries(claimed).cte("history")
    abandoned = (
        sa.exists()
        .where(
            turns.c.status == TurnStatus.ABORTING.value,
            turns.c.lease_expires_at < sa.bindparam("now", type_=TIMESTAMP),
        )
        .label("abandoned")
    )
    # Evaluated once (an uncorrelated subquery), however many turns were leased.
    noted = (
        sa.select(noting_leased(sa.func.array_agg(claimed.c.id))).scalar_subquery().label("noted")
    )
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    return PgStatement(
        sa.select(*(claimed.c[column.name] for column in turns.c), abandoned, noted)
        .select_from(one.outerjoin(claimed, sa.true()))
        .add_cte(history)
    )


#: Each turn the statement before it leased, with its progress (stores/snapshots.py's columns,
#: every leased turn's chain walked at once). A session keeps the setting, empty, after a
#: transaction that set it ends: no claim before it in this one leases nothing.
CLAIMED_PROGRESS = PgStatement(
    sa.text(
        f"""
WITH RECURSIVE leased AS (
    SELECT id, parent_id FROM turns
    WHERE id = ANY(CAST(NULLIF(current_setting('{_CLAIMED_SETTING}', true), '') AS text[]))
),
ancestry AS ({snapshot_sql.progress_walks("leased")})
SELECT leased.id, {snapshot_sql.progress_columns("leased", chains=True)}
FROM leased
"""
    )
)


_CHECKED_CLAIMS = {
    (agents, turn_ids, versions): _checked_claim(
        agents=agents, turn_ids=turn_ids, versions=versions
    )
    for agents in (False, True)
    for turn_ids in (False, True)
    for versions in (False, True)
}
