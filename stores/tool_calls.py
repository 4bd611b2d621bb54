"""SQL for the tool-call journal (``tool_calls``), including answers to interrupts."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import ApprovalNotPendingError
from engine.store import InterruptAnswer, ToolCallRecord, ToolCallStatus
from engine.store.history import call_entries, decision_entry
from engine.store.rules import check_answerable
from stores.database import record_from_row, upsert_statement
from stores.history import append_entries, append_history
from stores.schema import approval_queue, tool_calls, turns
from stores.turns import stopped_at_approvals

__all__ = [
    "answer_calls",
    "list_calls",
    "list_expired",
    "lock_open_call",
    "open_approval",
    "record_of",
    "refuse_not_pending",
    "upsert_calls",
]


def _row(turn_id: str, call: ToolCallRecord, now: datetime) -> dict[str, Any]:
    data = call.model_dump(mode="json")
    return {
        "turn_id": turn_id,
        "round": call.round,
        "ref": call.ref,
        "name": call.name,
        "input": data["input"],
        "status": call.status.value,
        "output": data["output"],
        "interrupt": data["interrupt"],
        "error": data["error"],
        "idempotency_key": call.idempotency_key,
        "resumed": data["resumed"],
        "answer": data["answer"],
        "decided_by": call.decided_by,
        "decided_at": call.decided_at,
        "started_at": call.started_at,
        "finished_at": call.finished_at,
        "deadline": call.deadline,
        "created_at": now,
        "effects": data["effects"],
    }


def record_of(row: sa.Row[tuple[object, ...]]) -> ToolCallRecord:
    """The journal record of a ``tool_calls`` row."""
    return record_from_row(ToolCallRecord, row)


def upsert_calls(
    connection: Connection,
    turn_id: str,
    calls: Sequence[ToolCallRecord],
    now: datetime,
    *,
    worker: str | None,
) -> None:
    """Insert or update journal rows keyed by ``(turn_id, round, ref)``, and append the
    history entries each write makes (:func:`engine.store.history.call_entries`), run by
    ``worker``, the lease owner the caller fenced on."""
    if not calls:
        return
    # The rows of the rounds written, as they were, under the transaction's write lock
    # (SQLite serialises writers): not the whole journal, which grows with every round.
    rounds = sorted({call.round for call in calls})
    written = connection.execute(
        sa.select(tool_calls).where(tool_calls.c.turn_id == turn_id, tool_calls.c.round.in_(rounds))
    )
    before = {(row.round, row.ref): record_of(row) for row in written}
    connection.execute(_UPSERT, [_row(turn_id, call, now) for call in calls])
    append_entries(
        connection,
        turn_id,
        [
            entry
            for call in calls
            for entry in call_entries(before.get((call.round, call.ref)), call, worker, now)
        ],
    )


# created_at keeps the first write's time: it is what an approval's age is measured from.
_UPSERT = upsert_statement(tool_calls, ["turn_id", "round", "ref"], keep=("created_at",))


def list_calls(connection: Connection, turn_id: str) -> list[ToolCallRecord]:
    """The turn's journal, by round then ref (ref in plain code-point order)."""
    rows = connection.execute(_BY_TURN, {"turn_id": turn_id}).all()
    return sorted((record_of(r) for r in rows), key=lambda c: (c.round, c.ref))


def answer_calls(connection: Connection, answers: Sequence[InterruptAnswer], now: datetime) -> None:
    """Mark each answered call ``answered`` — only if it is still ``interrupted`` and, when
    an approver already recorded a decision on it, only with that same answer.

    Each row is read under its row lock (SQLite: the transaction's write lock) before it is
    changed, so of two concurrent resumes the second finds it answered and raises, rolling
    its whole transaction back; a recorded decision keeps its approver.
    """
    for answer in answers:
        key = {"a_turn_id": answer.turn_id, "a_round": answer.round, "a_ref": answer.ref}
        row = connection.execute(_LOCK_CALL, key).first()
        call = record_of(row) if row is not None else None
        decider = check_answerable(call, answer)
        connection.execute(
            _ANSWER,
            {**key, "answer": answer.answer, "decided_by": decider, "a_decided_at": now},
        )
        if call is not None and call.decided_at is None:
            # An approver's decision was recorded when made; this one is made by the answer.
            append_history(
                connection, answer.turn_id, decision_entry(call, answer.answer, decider, now)
            )


# Built once (statement construction costs more CPU than these queries). The locked read
# before each answer is what makes an approval decidable once (see answer_calls).
_BY_TURN = sa.select(tool_calls).where(tool_calls.c.turn_id == sa.bindparam("turn_id"))
_CALL_KEY = (
    tool_calls.c.turn_id == sa.bindparam("a_turn_id"),
    tool_calls.c.round == sa.bindparam("a_round"),
    tool_calls.c.ref == sa.bindparam("a_ref"),
)
_LOCK_CALL = sa.select(tool_calls).where(*_CALL_KEY).with_for_update()
_ANSWER = (
    sa.update(tool_calls)
    .where(*_CALL_KEY)
    .values(
        status=ToolCallStatus.ANSWERED.value,
        # An inbox decision recorded earlier keeps its own moment.
        decided_at=sa.func.coalesce(
            tool_calls.c.decided_at,
            sa.bindparam("a_decided_at", type_=tool_calls.c.decided_at.type),
        ),
    )
)


def list_expired(
    connection: Connection, now: datetime, limit: int, agents: Collection[str] | None = None
) -> list[ToolCallRecord]:
    """Interrupted calls past their deadline on turns that are their session's latest."""
    later = turns.alias("later")
    of_agents = [turns.c.agent.in_(list(agents))] if agents is not None else []
    rows = connection.execute(
        sa.select(tool_calls)
        .join(turns, turns.c.id == tool_calls.c.turn_id)
        .where(
            tool_calls.c.status == ToolCallStatus.INTERRUPTED.value,
            tool_calls.c.deadline.is_not(None),
            tool_calls.c.deadline <= now,
            stopped_at_approvals(),
            ~sa.exists().where(later.c.session_id == turns.c.session_id, later.c.seq > turns.c.seq),
            *of_agents,
        )
        .order_by(tool_calls.c.deadline, tool_calls.c.turn_id, tool_calls.c.ref)
        .limit(limit)
    ).all()
    return [record_of(r) for r in rows]


def open_approval(turn_id: str, round: int, ref: str) -> tuple[sa.ColumnElement[bool], ...]:
    """The journal row of one open approval: interrupted, undecided, and in the queue (on a
    paused turn that is its session's latest)."""
    c = tool_calls.c
    q = approval_queue.c
    return (
        c.turn_id == turn_id,
        c.round == round,
        c.ref == ref,
        c.status == ToolCallStatus.INTERRUPTED.value,
        c.decided_at.is_(None),
        sa.exists().where(q.turn_id == turn_id, q.round == round, q.ref == ref),
    )


def lock_open_call(connection: Connection, turn_id: str, round: int, ref: str) -> ToolCallRecord:
    """Lock and read the journal row of one open approval (``FOR UPDATE``; SQLite serialises
    writers anyway) or raise the typed conflict describing why it is not open.

    Votes, guarded decisions and assignment changes all take this lock first, so each one
    reads the others' committed writes: a decision sees a reassignment that beat it, and an
    assignment change sees the decision that beat it (the row is then no longer open).
    """
    locked = connection.execute(
        sa.select(tool_calls)
        .where(*open_approval(turn_id, round, ref))
        .with_for_update(of=tool_calls)
    ).first()
    if locked is None:
        refuse_not_pending(connection, turn_id, round, ref)
    return record_of(locked)


def refuse_not_pending(connection: Connection, turn_id: str, round: int, ref: str) -> NoReturn:
    """Raise the typed conflict describing why the approval is not open."""
    c = tool_calls.c
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
