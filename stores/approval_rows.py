"""The open approvals' rows as the engine's :class:`~engine.store.PendingApproval`: one select
and one mapping, shared by the inbox's listing (:mod:`stores.approvals`) and the sweep's due
approvals (:mod:`stores.assignments`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from engine.store import PendingApproval
from stores.database import record_from_row
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
    # The queue's columns keep the journal's names: its ``name`` is the interrupt, its
    # ``interrupt`` the interrupt's metadata.
    return record_from_row(PendingApproval, row, interrupt=row.name, metadata=row.interrupt)
