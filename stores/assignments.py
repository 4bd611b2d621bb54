"""SQL for the assignment, escalation and reminders of open approvals (``approval_assignments``,
migrations 0010 and 0015; the rules are :mod:`engine.approvals.assignment`'s).

An approval has a row once anything was assigned, escalated or reminded; before that it is
assigned to its interrupt's default group. A change first inserts that starting row if there
is none (``ON CONFLICT DO NOTHING``: two writers at once insert it once), then makes the change
in one guarded UPDATE: the approval must still be open (in ``approval_queue``, undecided) and
the change's own guard must hold. Of two writers at once, PostgreSQL makes the second wait for
the first's row lock and then re-checks the guard against the committed row, so an approval
moves once per step of its escalation chain and is reminded once per interval; SQLite
serialises writers anyway. A change announces itself on the change channel (no turn's status
changes), for the inbox's live pages.

A change first locks the approval's journal row, the lock a decision or a vote takes
(:func:`stores.approvals.change_approval`, whose rule checks the assignment the decider saw
against :func:`stored_assignment` under it): a decision and a reassignment, escalation or
claim at once are serialised, so neither a decision by someone the change excluded nor a
change of an approval already decided is ever written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from engine.store import Assignment, AssignmentChange, DueQuery, PendingApproval
from engine.store.history import assignment_entry
from stores.approval_rows import pending_approval, select_pending
from stores.database import record_from_row
from stores.history import append_history
from stores.notify import CHANGE_CHANNEL, notify
from stores.schema import approval_assignments, approval_queue
from stores.tool_calls import lock_open_call, refuse_not_pending
from stores.webhooks import add_deliveries

__all__ = [
    "change_assignment",
    "get_assignments",
    "list_due_approvals",
    "stored_assignment",
]

Key = tuple[str, int, str]


def _assignment_of(row: sa.Row[Any]) -> Assignment:
    return record_from_row(Assignment, row, group=row.assigned_group)


def get_assignments(connection: Connection, keys: Sequence[Key]) -> dict[Key, Assignment]:
    """The stored assignments of these approvals."""
    if not keys:
        return {}
    a = approval_assignments.c
    wanted = set(keys)
    rows = connection.execute(
        sa.select(approval_assignments).where(a.turn_id.in_({k[0] for k in keys}))
    ).all()
    found = (_assignment_of(r) for r in rows)
    return {(f.turn_id, f.round, f.ref): f for f in found if (f.turn_id, f.round, f.ref) in wanted}


def stored_assignment(
    connection: Connection, turn_id: str, round: int, ref: str
) -> Assignment | None:
    """The stored assignment of one approval (``None``: none stored yet)."""
    a = approval_assignments.c
    row = connection.execute(
        sa.select(approval_assignments).where(a.turn_id == turn_id, a.round == round, a.ref == ref)
    ).first()
    return _assignment_of(row) if row is not None else None


def _is_open(turn_id: str, round: int, ref: str) -> sa.Exists:
    q = approval_queue.c
    return sa.exists().where(
        q.turn_id == turn_id, q.round == round, q.ref == ref, q.decided_at.is_(None)
    )


def _insert_starting_row(
    connection: Connection, turn_id: str, round: int, ref: str, default_group: str | None
) -> None:
    """The row an approval starts with (its default group), unless it has one already."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    q = approval_queue.c
    starting = sa.select(
        q.turn_id, q.round, q.ref, sa.literal(default_group, sa.Text), sa.literal(0)
    ).where(q.turn_id == turn_id, q.round == round, q.ref == ref, q.decided_at.is_(None))
    connection.execute(
        dialect.insert(approval_assignments)
        .from_select(["turn_id", "round", "ref", "assigned_group", "reminders"], starting)
        .on_conflict_do_nothing(index_elements=["turn_id", "round", "ref"])
    )


def _plan(
    change: AssignmentChange, now: datetime
) -> tuple[list[sa.ColumnElement[bool]], dict[str, Any]]:
    """The guard and the new values of ``change``."""
    now = change.at or now
    a = approval_assignments.c
    stamp = {"assigned_by": change.by, "assigned_at": now}
    if change.action == "claim":
        guard = [sa.or_(a.assignee.is_(None), a.assignee == change.by)]
        return guard, {"assignee": change.by, **stamp}
    if change.action == "assign":
        values: dict[str, Any] = dict(stamp)
        if change.group is not None:
            values.update(assigned_group=change.group, assignee=change.assignee)
        else:
            values["assignee"] = change.assignee
        return [], values
    if change.action == "release":
        guard = [a.assignee.is_not(None)]
        if change.holder is not None:
            guard = [a.assignee == change.holder]
        return guard, {"assignee": None, **stamp}
    if change.action == "escalate":
        return [a.escalation_step == change.from_step], {
            "escalation_step": change.from_step + 1,
            "escalated_from_assignee": a.assignee,
            "escalated_from_group": a.assigned_group,
            "escalated_to": change.group,
            "escalated_at": now,
            "assigned_group": change.group,
            "assignee": None,
            **stamp,
        }
    assert change.every_seconds is not None, "a reminder needs its interval"
    since = now - timedelta(seconds=change.every_seconds)
    guard = [sa.or_(a.last_reminded_at.is_(None), a.last_reminded_at <= since)]
    return guard, {"last_reminded_at": now, "reminders": a.reminders + 1}


def change_assignment(
    connection: Connection,
    turn_id: str,
    round: int,
    ref: str,
    change: AssignmentChange,
    *,
    default_group: str | None,
    now: datetime,
) -> Assignment | None:
    """See :meth:`engine.store.AssignmentBook.change_assignment`.

    The journal row is locked first, as a decision or a vote locks it: a change waits for a
    decision being recorded and then finds the approval decided, and a decision recorded
    after the change sees it.
    """
    lock_open_call(connection, turn_id, round, ref)
    _insert_starting_row(connection, turn_id, round, ref, default_group)
    a = approval_assignments.c
    guard, values = _plan(change, now)
    row = connection.execute(
        sa.update(approval_assignments)
        .where(a.turn_id == turn_id, a.round == round, a.ref == ref, _is_open(turn_id, round, ref))
        .where(*guard)
        .values(**values)
        .returning(*approval_assignments.columns)
    ).first()
    if row is not None:
        notify(connection, CHANGE_CHANNEL, turn_id)
        changed = _assignment_of(row)
        append_history(
            connection, turn_id, assignment_entry(ref, change, changed, change.at or now)
        )
        # The outbox rows reporting the change, only when it was made (same transaction).
        add_deliveries(connection, change.deliveries)
        return changed
    if not connection.execute(
        sa.select(sa.literal(1)).where(_is_open(turn_id, round, ref))
    ).first():
        refuse_not_pending(connection, turn_id, round, ref)
    return None  # open, but the change's guard refused it


def list_due_approvals(connection: Connection, query: DueQuery) -> list[PendingApproval]:
    """Open approvals of one interrupt old enough, at one step of their escalation chain and
    there long enough, and/or not reminded lately, oldest first (along ``approval_queue``'s
    ``created_at`` index)."""
    q = approval_queue.c
    a = approval_assignments.c
    conditions: list[sa.ColumnElement[bool]] = [
        q.decided_at.is_(None),
        q.agent.in_(query.agents),
        q.name == query.interrupt,
        q.created_at <= query.created_before,
    ]
    if query.escalation_step is not None:
        # No row yet: the approval is where it started, at step 0.
        conditions.append(sa.func.coalesce(a.escalation_step, 0) == query.escalation_step)
    if query.escalated_before is not None:
        conditions.append(a.escalated_at <= query.escalated_before)
    if query.reminded_before is not None:
        conditions.append(
            sa.or_(a.last_reminded_at.is_(None), a.last_reminded_at <= query.reminded_before)
        )
    joined = approval_queue.outerjoin(
        approval_assignments,
        sa.and_(a.turn_id == q.turn_id, a.round == q.round, a.ref == q.ref),
    )
    rows = connection.execute(
        select_pending(joined)
        .where(*conditions)
        .order_by(q.created_at, q.turn_id, q.ref)
        .limit(query.limit)
    ).all()
    return [pending_approval(r) for r in rows]
