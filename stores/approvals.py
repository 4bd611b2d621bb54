"""SQL for the approval inbox: open approvals across sessions, and decisions on them.

An approval is *open* while its journal row is ``interrupted`` and undecided on a turn that is
paused (``completed``/``interrupted``) and still its session's latest. A decision fills
``answer``/``decided_by``/``decided_at`` and leaves the row ``interrupted``: the resume built
from the decisions marks it ``answered``, guarded as every resume is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import ApprovalNotPendingError
from engine.status import FinishReason, TurnStatus
from engine.store import ApprovalQuery, PendingApproval, ToolCallRecord, ToolCallStatus
from stores.database import utc
from stores.schema import sessions, tool_calls, turns
from stores.tool_calls import record_of

__all__ = ["list_approvals", "record_decision"]


def _paused_and_latest() -> list[sa.ColumnElement[bool]]:
    """Conditions on ``turns``: paused at interrupts, and no later turn in its session."""
    later = turns.alias("later")
    return [
        turns.c.status == TurnStatus.COMPLETED.value,
        turns.c.finish_reason == FinishReason.INTERRUPTED.value,
        ~sa.exists().where(later.c.session_id == turns.c.session_id, later.c.seq > turns.c.seq),
    ]


def list_approvals(connection: Connection, query: ApprovalQuery) -> list[PendingApproval]:
    """Open approvals in ``(created_at, turn_id, ref)`` order, filtered and keyset-paged.

    Starts from the partial index ``ix_tool_calls_open`` (interrupted rows by created_at), so
    a page costs a few index probes however many settled turns the table holds.
    """
    c = tool_calls.c
    conditions: list[sa.ColumnElement[bool]] = [
        c.status == ToolCallStatus.INTERRUPTED.value,
        c.decided_at.is_(None),
        *_paused_and_latest(),
    ]
    if query.agents is not None:
        conditions.append(turns.c.agent.in_(query.agents))
    if query.interrupt is not None:
        conditions.append(c.name == query.interrupt)
    if query.owner is not None:
        conditions.append(sessions.c.owner == query.owner)
    if query.created_before is not None:
        conditions.append(c.created_at <= query.created_before)
    if query.after is not None:
        created, turn_id, ref = query.after
        conditions.append(sa.tuple_(c.created_at, c.turn_id, c.ref) > (created, turn_id, ref))
    rows = connection.execute(
        sa.select(
            c.turn_id,
            turns.c.session_id,
            turns.c.agent,
            sessions.c.owner,
            c.round,
            c.name,
            c.ref,
            c.input,
            c.interrupt,
            c.deadline,
            c.created_at,
        )
        .select_from(
            tool_calls.join(turns, turns.c.id == c.turn_id).join(
                sessions, sessions.c.id == turns.c.session_id
            )
        )
        .where(*conditions)
        .order_by(c.created_at, c.turn_id, c.ref)
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
    open_turn = sa.select(turns.c.id).where(turns.c.id == turn_id, *_paused_and_latest())
    result = connection.execute(
        sa.update(tool_calls)
        .where(
            c.turn_id == turn_id,
            c.round == round,
            c.ref == ref,
            c.status == ToolCallStatus.INTERRUPTED.value,
            c.decided_at.is_(None),
            sa.exists(open_turn),
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
