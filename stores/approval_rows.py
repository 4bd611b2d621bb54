"""The open approvals' rows as the engine's :class:`~engine.store.PendingApproval`: one select
and one mapping, shared by the inbox's listing (:mod:`stores.approvals`) and the sweep's due
approvals (:mod:`stores.assignments`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from engine.store import PendingApproval
from stores.database import utc
from stores.schema import approval_queue, sessions, turns

__all__ = ["pending_approval", "select_pending"]


def select_pending(source: sa.FromClause) -> sa.Select[Any]:
    """The columns of a :class:`PendingApproval` from ``source``, which holds
    ``approval_queue``: the session for its owner and the turn for its version are joined by
    their keys, a probe per listed entry."""
    q = approval_queue.c
    return sa.select(
        q.turn_id,
        q.session_id,
        q.agent,
        sessions.c.owner,
        q.round,
        q.name,
        q.ref,
        q.input,
        q.interrupt,
        q.deadline,
        q.created_at,
        turns.c.app_version,
    ).select_from(
        source.join(sessions, sessions.c.id == q.session_id).join(turns, turns.c.id == q.turn_id)
    )


def pending_approval(row: sa.Row[Any]) -> PendingApproval:
    """A row of :func:`select_pending` as the engine's record."""
    return PendingApproval(
        turn_id=row.turn_id,
        session_id=row.session_id,
        agent=row.agent,
        owner=row.owner,
        round=row.round,
        interrupt=row.name,
        ref=row.ref,
        input=row.input,
        metadata=row.interrupt,
        deadline=utc(row.deadline),
        created_at=utc(row.created_at),
        app_version=row.app_version,
    )
