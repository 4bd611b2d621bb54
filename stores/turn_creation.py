"""SQL for creating a turn: the one write that touches a session, the answered journal rows,
the new ``turns`` row, its opening message and its first ``turn_events`` row.

Two forms of the same write. :func:`create_turn` is the reference: a transaction of a few
statements that checks each rule in turn and raises the precise typed error. On PostgreSQL,
:func:`create_turn_in_one_statement` first tries the common case — every rule satisfied — as
one statement on an autocommit connection: one round trip where the transaction costs seven,
on the path of every send and every resume. It commits only when every rule holds; otherwise
it writes nothing and the caller runs :func:`create_turn`, which names the problem (or
succeeds, if the conflict it saw is already gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import InvalidArgumentError, SessionBusyError
from engine.store import InterruptAnswer, NewTurn, RoundRecord, TurnRecord
from engine.store_rules import check_parent, check_session
from stores import json_codec
from stores import messages as message_sql
from stores import sessions as session_sql
from stores import tool_calls as call_sql
from stores import turns as turn_sql
from stores.notify import WORK_CHANNEL
from stores.pg import PgConnections, PgStatement
from stores.schema import JSON, TIMESTAMP

__all__ = ["create_turn", "create_turn_in_one_statement"]


def create_turn(
    connection: Connection, turn: NewTurn, answers: Sequence[InterruptAnswer], now: datetime
) -> TurnRecord:
    """Create the pending turn in the caller's transaction, checking every rule in order."""
    agent = session_sql.lock_or_create_session(
        connection, turn.session_id, turn.agent, turn.owner, now
    )
    if agent != turn.agent:
        raise InvalidArgumentError(
            f"Session {turn.session_id} belongs to agent '{agent}', not '{turn.agent}'."
        )
    if turn.owner is not None:
        # Only a caller acting for a principal pays this read (HTTP with auth).
        session = session_sql.get_session(connection, turn.session_id)
        assert session is not None  # created or locked just above
        check_session(session, turn)
    active = turn_sql.active_turn(connection, turn.session_id)
    if active is not None:
        active_id, active_status = active
        raise SessionBusyError(
            f"Session {turn.session_id} already has a running turn ({active_id}, "
            f"{active_status.value}); wait for it to settle or abort it.",
            snapshot_id=active_id,
        )
    call_sql.answer_calls(connection, answers, now)
    # The session row is locked above, so no other turn can join the session meanwhile.
    latest = turn_sql.latest_turn_id(connection, turn.session_id)
    # A duplicate id fails on the primary key (mapped by the store), rolling back the
    # session row too: no separate existence check (one round trip less).
    created = turn_sql.insert_turn(connection, turn, now)
    # Checked after the insert so a duplicate id is reported as such; raising rolls it back.
    check_parent(turn, latest)
    if turn.initial_messages:
        message_sql.save_round(
            connection,
            turn.id,
            RoundRecord(round=0, messages=turn.initial_messages, committed=True),
            now,
            replace=False,
        )
    return created


async def create_turn_in_one_statement(
    pg: PgConnections, turn: NewTurn, answers: Sequence[InterruptAnswer], now: datetime
) -> TurnRecord | None:
    """Try the whole creation as one statement (PostgreSQL, autocommit connection).

    Returns the created turn, or ``None`` when a rule refused it (unknown agent for the
    session, a running turn, a parent that is not the session's latest) — nothing was
    written then. Raises
    :class:`~stores.pg.StatementRefused` when a constraint refused it: a duplicate id, a
    concurrent creator (``seq`` or the one-running-turn index), or an answer no longer
    pending (see ``_CREATE``); the statement rolled back.
    Only for a turn without an owner: the owner check reads the session (the caller takes
    :func:`create_turn` for those).
    """
    assert turn.owner is None, "a turn with an owner is created by create_turn"
    opening = message_sql.message_rows(turn.initial_messages)
    answered = [
        {
            "turn_id": answer.turn_id,
            "round": answer.round,
            "ref": answer.ref,
            "answer": answer.answer,
            "decided_by": answer.decided_by,
        }
        for answer in answers
    ]
    rows = await pg.fetch(
        _CREATE[bool(answered), bool(opening)],
        {
            "id": turn.id,
            "session_id": turn.session_id,
            "agent": turn.agent,
            "parent_id": turn.parent_id,
            "input": turn.input.model_dump(mode="json", by_alias=True, exclude_unset=True),
            "history_length": turn.history_length,
            "max_attempts": turn.max_attempts,
            "now": now,
            # Serialised here: jsonb_to_recordset takes one JSON document per parameter.
            "answers": json_codec.dumps(answered),
            "answer_count": len(answered),
            "messages": json_codec.dumps(opening),
            "work_channel": WORK_CHANNEL,
        },
    )
    return turn_sql.record(rows[0]) if rows else None


# The CTEs run as one statement, all on one snapshot:
# - `ready` is one row when the session is new or the agent's, has no running turn and its
#   latest turn is the new turn's parent; every write below joins it, so a refused request
#   writes nothing at all.
# - `session` creates the session or takes its row lock (as the transaction's first
#   statement does); `created` reads it first, so the lock is taken before any journal row
#   is (the order the transaction uses too: no lock-order deadlock between the two forms).
# - A concurrent creator that committed after our snapshot is caught by a constraint, not
#   by `ready`: `uq_turns_session_id_seq` or `ux_turns_one_active_per_session`.
# - `answered` flips each answer's row from interrupted to answered; a row another resume
#   answered first is re-checked after its lock and skipped. Then fewer rows than answers
#   leave the new turn's id NULL, and its NOT NULL constraint fails the statement, undoing
#   every write in it: the answers are decided once, all together or not at all. A row an
#   approver already decided is answered only with that decision, and keeps its approver.
def _create_statement(*, answers: bool, opening: bool) -> sa.TextClause:
    """The statement for a request with or without answers and an opening message: a part
    with nothing to write is left out, so the statement does not even lock its table."""
    parts = [
        """
WITH ready AS (
    SELECT 1 AS ready
    WHERE COALESCE((SELECT agent = :agent FROM sessions WHERE id = :session_id), true)
      AND NOT EXISTS (
          SELECT 1 FROM turns
          WHERE session_id = :session_id AND status IN ('pending', 'aborting'))
      AND (SELECT id FROM turns WHERE session_id = :session_id ORDER BY seq DESC LIMIT 1)
          IS NOT DISTINCT FROM CAST(:parent_id AS text)),
session AS (
    INSERT INTO sessions (id, agent, owner, created_at, updated_at)
    SELECT :session_id, :agent, NULL, :now, :now FROM ready
    ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at
    RETURNING id),"""
    ]
    if answers:
        parts.append(
            """
answered AS (
    UPDATE tool_calls AS c
    SET status = 'answered', answer = a.answer,
        decided_by = CASE WHEN c.decided_at IS NULL THEN a.decided_by ELSE c.decided_by END,
        decided_at = COALESCE(c.decided_at, :now)
    FROM jsonb_to_recordset(CAST(:answers AS jsonb))
             AS a(turn_id text, round integer, ref text, answer jsonb, decided_by text),
         ready
    -- Answers name calls of the parent (an answer naming another turn's call matches
    -- nothing, the count below refuses the statement, and the reference form raises the
    -- precise error). Saying so lets the plan read the parent's journal by its key; on
    -- the answer rows alone it hash-joined every open approval, on every resume.
    WHERE c.turn_id = :parent_id
      AND c.turn_id = a.turn_id AND c.round = a.round AND c.ref = a.ref
      AND c.status = 'interrupted'
      AND (c.decided_at IS NULL OR c.answer = a.answer)
    RETURNING c.ref),"""
        )
    turn_id = (
        "CASE WHEN (SELECT count(*) FROM answered) = :answer_count THEN :id END"
        if answers
        else ":id"
    )
    parts.append(
        f"""
created AS (
    INSERT INTO turns (id, session_id, seq, agent, parent_id, status, input, history_length,
                       attempts, max_attempts, lease_token, run_after, created_at, updated_at)
    SELECT {turn_id},
           session.id,
           (SELECT coalesce(max(seq), 0) + 1 FROM turns WHERE session_id = :session_id),
           :agent, :parent_id, CAST('pending' AS turn_status), :input, :history_length,
           0, :max_attempts, 0, :now, :now, :now
    FROM session
    RETURNING *),"""
    )
    if opening:
        parts.append(
            """
opening AS (
    INSERT INTO messages (turn_id, round, position, role, content, metadata, committed,
                          created_at)
    SELECT created.id, 0, m.position, m.role, m.content, m.metadata, true, :now
    FROM created, jsonb_to_recordset(CAST(:messages AS jsonb))
                      AS m(position integer, role text, content jsonb, metadata jsonb)),"""
        )
    parts.append(
        """
event AS (
    INSERT INTO turn_events (turn_id, from_status, to_status, attempt, note, at)
    SELECT id, NULL, CAST('pending' AS turn_status), 0, NULL, :now FROM created
    RETURNING pg_notify(:work_channel, turn_id))
SELECT created.* FROM created
"""
    )
    bound = sa.text("".join(parts)).bindparams(
        sa.bindparam("now", type_=TIMESTAMP),
        sa.bindparam("input", type_=JSON),
        sa.bindparam("history_length", type_=sa.Integer),
        sa.bindparam("max_attempts", type_=sa.Integer),
    )
    if answers:
        bound = bound.bindparams(sa.bindparam("answer_count", type_=sa.Integer))
    return bound


_CREATE = {
    (answers, opening): PgStatement(_create_statement(answers=answers, opening=opening))
    for answers in (False, True)
    for opening in (False, True)
}
