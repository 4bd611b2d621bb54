"""SQL for claiming turns: the claim statement, its one-round-trip form, and the recovery of
aborts whose worker died.

A claim is one UPDATE leasing the oldest claimable turns, ``FOR UPDATE SKIP LOCKED`` so that
concurrent workers take different rows without waiting on one another. A turn whose lease
expired (its worker died) is claimable again through the same query: recovery is part of
claiming. On SQLite the transaction's ``BEGIN IMMEDIATE`` serialises claimers instead.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from engine.status import TurnStatus
from engine.store import FollowOnClaim, TurnRecord
from engine.store.rules import ABANDONED_ABORT
from stores.pg import PgConnections, PgStatement
from stores.schema import TIMESTAMP, turns
from stores.turns import record, transition

__all__ = [
    "CheckedClaim",
    "ClaimRequest",
    "checked_claim_of",
    "checked_claim_query",
    "claim",
    "claim_checking_abandoned",
    "claim_statement",
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


def claim_statement(request: ClaimRequest) -> sa.Update:
    """The claim PostgreSQL runs for ``request``, its values bound (for callers that compile
    it, e.g. to EXPLAIN it)."""
    agents, turn_ids, versions = request.form
    return _claim_update(
        agents=agents, turn_ids=turn_ids, versions=versions, arrays=True, values=request.params()
    )


def claim(connection: Connection, request: ClaimRequest) -> list[TurnRecord]:
    """Lease the claimable turns ``request`` asks for, in a transaction (the SQLite path;
    PostgreSQL uses :func:`claim_checking_abandoned`).

    First settles ``aborting`` turns whose worker died (lease expired): nobody else would,
    and their session would stay busy forever. Recovery stays part of claiming.
    """
    settle_abandoned(connection, request.now, request.limit)
    rows = connection.execute(_CLAIMS[request.form], request.params()).all()
    return sorted((record(r) for r in rows), key=lambda t: (t.run_after, t.id))


@dataclass(frozen=True)
class CheckedClaim:
    """What :func:`claim_checking_abandoned` found."""

    #: The leased turns, oldest ``run_after`` first.
    turns: list[TurnRecord]
    #: Whether an ``aborting`` turn whose worker died waits for :func:`settle_abandoned`.
    abandoned: bool


async def claim_checking_abandoned(pg: PgConnections, request: ClaimRequest) -> CheckedClaim:
    """The claim as one autocommit statement (PostgreSQL), which also says whether an
    ``aborting`` turn whose worker died is waiting to be settled (rare; the caller runs
    :func:`settle_abandoned` in its own transaction).

    One round trip instead of four (``BEGIN``, the recovery read, the claim, ``COMMIT``): the
    claim sits on the path from a resume to its pickup. The UPDATE is atomic on its own;
    ``SKIP LOCKED`` still keeps concurrent claimers apart.
    """
    return checked_claim_of(await pg.fetch(*checked_claim_query(request)))


def checked_claim_query(request: ClaimRequest) -> tuple[PgStatement, dict[str, Any]]:
    """The statement and values of :func:`claim_checking_abandoned`, for a caller that runs
    it in one transaction after statements of its own; :func:`checked_claim_of` reads its
    rows."""
    return _CHECKED_CLAIMS[request.form], request.params()


def checked_claim_of(rows: Sequence[dict[str, Any]]) -> CheckedClaim:
    """What the rows of the checked claim say."""
    claimed: list[TurnRecord] = []
    abandoned = False
    for row in rows:
        abandoned = abandoned or bool(row["abandoned"])
        if row["id"] is not None:  # the one row of an empty claim has no turn
            claimed.append(record(row))
    claimed.sort(key=lambda t: (t.run_after, t.id))
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


def _claim_update(
    *,
    agents: bool,
    turn_ids: bool,
    versions: bool = False,
    arrays: bool,
    values: dict[str, Any] | None = None,
) -> sa.Update:
    """The claim with bound parameters ``now``, ``expires``, ``owner``, ``limit``, and
    ``agents``/``turn_ids``/``versions`` when used — carrying ``values`` when given, else left
    for the execution to supply. With ``arrays`` (PostgreSQL) the lists are one array parameter each
    (``= ANY(…)``), so the statement's text does not depend on their length."""

    def param(name: str, **kwargs: Any) -> sa.BindParameter[Any]:
        if values is None:
            return sa.bindparam(name, **kwargs)
        return sa.bindparam(name, values[name], **kwargs)

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
        candidates = sa.select(turns.c.id).where(
            one_of(turns.c.id, "turn_ids"),
            sa.cast(turns.c.status, sa.Text) == TurnStatus.PENDING.value,
            _due(now),
        )
    else:
        candidates = sa.select(turns.c.id).where(_claimable(now))
    if agents:
        candidates = candidates.where(one_of(turns.c.agent, "agents"))
    if versions:
        # Turns created before definitions were pinned carry no version: anyone runs them.
        candidates = candidates.where(
            sa.or_(turns.c.app_version.is_(None), one_of(turns.c.app_version, "versions"))
        )
    candidates = (
        candidates.order_by(turns.c.run_after, turns.c.id)
        .limit(param("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
    )
    return (
        sa.update(turns)
        .where(turns.c.id.in_(candidates.scalar_subquery()))
        .values(
            lease_owner=param("owner"),
            lease_expires_at=param("expires", type_=TIMESTAMP),
            lease_token=turns.c.lease_token + 1,
            attempts=turns.c.attempts + 1,
            updated_at=now,
        )
        .returning(turns)
    )


_CLAIMS = {
    (agents, turn_ids, versions): _claim_update(
        agents=agents, turn_ids=turn_ids, versions=versions, arrays=False
    )
    for agents in (False, True)
    for turn_ids in (False, True)
    for versions in (False, True)
}


def _checked_claim(*, agents: bool, turn_ids: bool, versions: bool) -> PgStatement:
    """The claim as a data-modifying CTE, left-joined to one row so that an empty claim
    still answers the recovery question (``abandoned``: an index probe on the partial
    index ``ix_turns_aborting``)."""
    claimed = _claim_update(agents=agents, turn_ids=turn_ids, versions=versions, arrays=True).cte(
        "claimed"
    )
    abandoned = (
        sa.exists()
        .where(
            turns.c.status == TurnStatus.ABORTING.value,
            turns.c.lease_expires_at < sa.bindparam("now", type_=TIMESTAMP),
        )
        .label("abandoned")
    )
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    return PgStatement(
        sa.select(*claimed.c, abandoned).select_from(one.outerjoin(claimed, sa.true()))
    )


_CHECKED_CLAIMS = {
    (agents, turn_ids, versions): _checked_claim(
        agents=agents, turn_ids=turn_ids, versions=versions
    )
    for agents in (False, True)
    for turn_ids in (False, True)
    for versions in (False, True)
}
