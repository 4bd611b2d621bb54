"""SQL for the approval inbox: open approvals across sessions, and decisions on them.

An approval is *open* while its journal row is ``interrupted`` and undecided on a turn that is
paused (``completed``/``interrupted``) and still its session's latest. A decision fills
``answer``/``decided_by``/``decided_at`` and leaves the row ``interrupted``: the resume built
from the decisions marks it ``answered``, guarded as every resume is. The open approvals are
the rows of ``approval_queue``, which triggers keep exact (migration 0003, docs/schema.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import ApprovalNotPendingError
from engine.store import ApprovalQuery, PendingApproval, ToolCallRecord, ToolCallStatus
from stores.database import utc
from stores.schema import approval_queue, sessions, tool_calls
from stores.tool_calls import record_of

__all__ = ["list_approvals", "record_decision"]


def list_approvals(connection: Connection, query: ApprovalQuery) -> list[PendingApproval]:
    """Open approvals in ``(created_at, turn_id, ref)`` order, filtered and keyset-paged.

    Reads ``approval_queue`` (exactly the open approvals, kept by triggers) along its
    ``(created_at, turn_id, ref)`` index, joining ``sessions`` only for the owner: a page
    costs a few index probes however many turns the tables hold.
    """
    q = approval_queue.c
    conditions: list[sa.ColumnElement[bool]] = [q.decided_at.is_(None)]
    if query.agents is not None:
        conditions.append(q.agent.in_(query.agents))
    if query.interrupt is not None:
        conditions.append(q.name == query.interrupt)
    if query.owner is not None:
        conditions.append(sessions.c.owner == query.owner)
    if query.created_before is not None:
        conditions.append(q.created_at <= query.created_before)
    if query.after is not None:
        created, turn_id, ref = query.after
        conditions.append(sa.tuple_(q.created_at, q.turn_id, q.ref) > (created, turn_id, ref))
    rows = connection.execute(
        sa.select(
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
        )
        .select_from(approval_queue.join(sessions, sessions.c.id == q.session_id))
        .where(*conditions)
        .order_by(q.created_at, q.turn_id, q.ref)
        .limit(query.limit)
    ).all()
    return [
        PendingApproval(
            turn_id=r.turn_id,
            session_id=r.session_id,
            agent=r.agent,
            owner=r.owner,
            round=r.round,
            interrupt=r.name,
            ref=r.ref,
            input=r.input,
            metadata=r.interrupt,
            deadline=utc(r.deadline),
            created_at=utc(r.created_at),
        )
        for r in rows
    ]


def record_decision(
    connection: Connection,
    turn_id: str,
    round: int,
    ref: str,
    *,
    answer: Any,
    decided_by: str | None,
    now: datetime,
) -> ToolCallRecord:
    """Fill in the decision on one open approval and return its row; zero rows matched → the
    typed conflict.

    One guarded UPDATE: of two approvers deciding the same call at once, the second matches
    nothing (the first set ``decided_at``) and gets :class:`ApprovalNotPendingError`.
    """
    c = tool_calls.c
    q = approval_queue.c
    # Open = in the queue: interrupted, on a paused turn that is its session's latest.
    is_open = sa.exists().where(q.turn_id == turn_id, q.round == round, q.ref == ref)
    result = connection.execute(
        sa.update(tool_calls)
        .where(
            c.turn_id == turn_id,
            c.round == round,
            c.ref == ref,
            c.status == ToolCallStatus.INTERRUPTED.value,
            c.decided_at.is_(None),
            is_open,
        )
        .values(answer=answer, decided_by=decided_by, decided_at=now)
        .returning(*tool_calls.columns)
    )
    decided = result.first()
    if decided is not None:
        return record_of(decided)
    current = connection.execute(
        sa.select(c.status, c.decided_by, c.decided_at).where(
            c.turn_id == turn_id, c.round == round, c.ref == ref
        )
    ).first()
    if current is None:
        state = "unknown"
    elif current.decided_at is not None:
        state = f"decided by {current.decided_by or 'someone'}"
    else:
        state = str(current.status)
    raise ApprovalNotPendingError(
        f"Interrupt '{ref}' of snapshot {turn_id} is not pending (it is {state}); it may have "
        "been decided already.",
        snapshot_id=turn_id,
    )
