"""SQL for the approval inbox: open approvals across sessions, and decisions on them.

An approval is *open* while its journal row is ``interrupted`` and undecided on a turn that is
paused (``completed``/``interrupted``) and still its session's latest. A decision fills
``answer``/``decided_by``/``decided_at`` and leaves the row ``interrupted``: the resume built
from the decisions marks it ``answered``, guarded as every resume is. The open approvals are
the rows of ``approval_queue``, which triggers keep exact (:mod:`stores.triggers`, created by
migration 0003; docs/schema.md).

Decisions and votes (``approval_votes``, migration 0006) go through :func:`change_approval`:
it locks the journal row, reads what the engine's rule needs (the row, its votes, its stored
assignment), and writes what the rule decides — votes cleared, a vote added, the decision —
in the same transaction. The rules themselves are the engine's
(:mod:`engine.approvals.rules`): this module holds no policy. A vote that does not decide
changes no turn's status, so it announces itself on the change channel (the inbox's live
pages show the vote count).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.status import FinishReason, TurnStatus
from engine.store import (
    ApprovalQuery,
    ApprovalRule,
    DecidedApproval,
    DecisionQuery,
    OpenApproval,
    PendingApproval,
    Vote,
    VoteOutcome,
)
from engine.store.history import decision_entry, vote_entry
from stores.approval_rows import pending_approval, select_pending
from stores.assignments import stored_assignment
from stores.database import record_from_row
from stores.history import append_history
from stores.notify import CHANGE_CHANNEL, notify
from stores.schema import (
    approval_assignments,
    approval_queue,
    approval_votes,
    sessions,
    tool_calls,
    turns,
)
from stores.tool_calls import lock_open_call, open_approval, record_of, refuse_not_pending
from stores.webhooks import add_deliveries

__all__ = [
    "change_approval",
    "list_approvals",
    "list_decisions",
    "list_votes",
    "refuse_not_pending",
]


def list_approvals(connection: Connection, query: ApprovalQuery) -> list[PendingApproval]:
    """Open approvals in ``(created_at, turn_id, ref)`` order (or its reverse), filtered and
    keyset-paged.

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
    key = sa.tuple_(q.created_at, q.turn_id, q.ref)
    if query.after is not None:
        created, turn_id, ref = query.after
        seen = (created, turn_id, ref)
        conditions.append(key < seen if query.descending else key > seen)
    order = (
        (q.created_at.desc(), q.turn_id.desc(), q.ref.desc())
        if query.descending
        else (q.created_at, q.turn_id, q.ref)
    )
    rows = connection.execute(
        select_pending(approval_queue).where(*conditions).order_by(*order).limit(query.limit)
    ).all()
    return [pending_approval(r) for r in rows]


def list_decisions(connection: Connection, query: DecisionQuery) -> list[DecidedApproval]:
    """Decided interrupts, newest decision first, filtered and keyset-paged, each with the
    first turn created from its paused turn (the resume) and that turn's status.

    Reads the journal rows with a decision (``decided_at`` set), joining the paused turn and
    its session, and the approval's assignment row (by its key) for an escalation before the
    decision; the continuing turn is the paused turn's child of lowest ``seq``.
    """
    c = tool_calls.c
    a = approval_assignments.c
    child = turns.alias("child")
    following = (
        sa.select(child.c.id)
        .where(child.c.parent_id == c.turn_id)
        .order_by(child.c.seq)
        .limit(1)
        .scalar_subquery()
    )
    conditions: list[sa.ColumnElement[bool]] = [c.decided_at.is_not(None)]
    if query.agents is not None:
        conditions.append(turns.c.agent.in_(query.agents))
    if query.interrupt is not None:
        conditions.append(c.name == query.interrupt)
    if query.owner is not None:
        conditions.append(sessions.c.owner == query.owner)
    if query.decided_by is not None:
        conditions.append(c.decided_by == query.decided_by)
    if query.before is not None:
        seen_at, seen_turn, seen_ref = query.before
        conditions.append(
            sa.tuple_(c.decided_at, c.turn_id, c.ref) < (seen_at, seen_turn, seen_ref)
        )
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
            c.answer,
            c.decided_by,
            c.decided_at,
            c.created_at,
            following.label("next_turn_id"),
            a.escalated_at,
            a.escalated_from_group,
            a.escalated_from_assignee,
            a.escalated_to,
            sa.func.coalesce(a.escalation_step, 0).label("escalation_step"),
        )
        .select_from(
            tool_calls.join(turns, turns.c.id == c.turn_id)
            .join(sessions, sessions.c.id == turns.c.session_id)
            .outerjoin(
                approval_assignments,
                sa.and_(a.turn_id == c.turn_id, a.round == c.round, a.ref == c.ref),
            )
        )
        .where(*conditions)
        .order_by(c.decided_at.desc(), c.turn_id.desc(), c.ref.desc())
        .limit(query.limit)
    ).all()
    next_ids = {r.next_turn_id for r in rows if r.next_turn_id is not None}
    outcomes = (
        {
            o.id: o
            for o in connection.execute(
                sa.select(turns.c.id, turns.c.status, turns.c.finish_reason).where(
                    turns.c.id.in_(next_ids)
                )
            )
        }
        if next_ids
        else {}
    )
    decided: list[DecidedApproval] = []
    for r in rows:
        outcome = outcomes.get(r.next_turn_id)
        decided.append(
            record_from_row(
                DecidedApproval,
                r,
                interrupt=r.name,
                metadata=r.interrupt,
                next_status=TurnStatus(outcome.status) if outcome is not None else None,
                next_finish_reason=(
                    FinishReason(outcome.finish_reason)
                    if outcome is not None and outcome.finish_reason
                    else None
                ),
            )
        )
    return decided


def list_votes(connection: Connection, turn_id: str, round: int, ref: str) -> list[Vote]:
    """The votes on one approval, oldest first."""
    v = approval_votes.c
    rows = connection.execute(
        sa.select(approval_votes)
        .where(v.turn_id == turn_id, v.round == round, v.ref == ref)
        .order_by(v.voted_at, v.voter)
    ).all()
    return [record_from_row(Vote, r) for r in rows]


def change_approval(
    connection: Connection,
    turn_id: str,
    round: int,
    ref: str,
    rule: ApprovalRule,
    now: datetime,
) -> VoteOutcome:
    """Apply the engine's ``rule`` to one open approval and write what it decides.

    The journal row is locked first (``FOR UPDATE``; SQLite serialises writers anyway), as
    every assignment change locks it, so concurrent votes, decisions and reassignments of one
    approval run one after the other and each reads what the others committed: exactly one
    vote sees the quorum reached, and a decision sees a reassignment that beat it. The rule
    then reads the row, its votes and its stored assignment and says what to write; when it
    refuses, the transaction writes nothing.
    """
    call = lock_open_call(connection, turn_id, round, ref)
    votes = list_votes(connection, turn_id, round, ref)
    change = rule(
        OpenApproval(
            call=call,
            votes=votes,
            assignment=stored_assignment(connection, turn_id, round, ref),
            now=now,
        )
    )
    v = approval_votes.c
    if change.clear_votes:
        connection.execute(
            sa.delete(approval_votes).where(v.turn_id == turn_id, v.round == round, v.ref == ref)
        )
    if change.vote is not None:
        connection.execute(sa.insert(approval_votes).values(**change.vote.model_dump()))
        append_history(connection, turn_id, vote_entry(call, change.vote))
        # Delivered with the commit, so open inbox pages re-read the vote count.
        notify(connection, CHANGE_CHANNEL, turn_id)
    if change.clear_votes or change.vote is not None:
        votes = list_votes(connection, turn_id, round, ref)
    decided = None
    if change.decides:
        # The row is locked and was open: this guarded UPDATE matches it.
        row = connection.execute(
            sa.update(tool_calls)
            .where(*open_approval(turn_id, round, ref))
            .values(answer=change.answer, decided_by=change.decided_by, decided_at=now)
            .returning(*tool_calls.columns)
        ).first()
        if row is None:
            refuse_not_pending(connection, turn_id, round, ref)
        decided = record_of(row)
        append_history(
            connection, turn_id, decision_entry(call, change.answer, change.decided_by, now)
        )
    # The outbox rows reporting the decision commit or roll back with it.
    add_deliveries(connection, change.deliveries)
    return VoteOutcome(votes=votes, decided=decided)
