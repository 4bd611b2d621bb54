"""SQL for creating a turn: the one write that touches a session, the answered journal rows,
the new ``turns`` row, its opening message and its first ``turn_events`` row.

One form per backend. On SQLite, :func:`create_turn` is a transaction that checks each rule
in turn under the session's lock and raises the precise typed error. On PostgreSQL,
:func:`create_turn_in_one_statement` is one statement on an autocommit connection (one
round trip on the path of every send and every resume): it writes only when every rule
holds, and otherwise reports what it saw of the session, from which
:func:`engine.store.rules.check_creation` names the rule that refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import (
    AgentError,
    ApprovalNotPendingError,
    InvalidArgumentError,
    SessionBusyError,
    StaleSnapshotError,
)
from engine.status import TurnStatus
from engine.store import (
    ClaimedTurn,
    InterruptAnswer,
    NewTurn,
    RoundRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)
from engine.store.history import claimed_entry, decision_summary
from engine.store.rules import (
    CreationRefused,
    check_creation,
    check_not_busy,
    check_parent,
    check_session,
)
from stores import json_codec
from stores import messages as message_sql
from stores import sessions as session_sql
from stores import tool_calls as call_sql
from stores import turns as turn_sql
from stores.notify import WORK_CHANNEL
from stores.pg import PgConnections, PgStatement, Row, StatementRefused, sql_text
from stores.schema import JSON, TIMESTAMP
from stores.snapshots import progress_of
from stores.turn_claims import CLAIMED_PROGRESS, noting_leased

__all__ = ["create_claimed_turn_in_one_round_trip", "create_turn", "create_turn_in_one_statement"]


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
    check_not_busy(turn.session_id, turn_sql.active_turn(connection, turn.session_id))
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
) -> TurnRecord:
    """Create the pending turn with one statement (PostgreSQL, autocommit connection).

    A rule that refuses it (the session is another agent's or another owner's, it has a
    running turn, an answer is not pending or contradicts a recorded decision, the id is
    taken, the session's latest turn is not the one the request was checked against) writes
    nothing and raises the typed error naming it. A concurrent creator that commits first
    is caught by a constraint instead, mapped by :func:`_raced`.
    """
    row, _ = await _run_creation(pg, turn, answers, now, None)
    return turn_sql.record(row)


async def create_claimed_turn_in_one_round_trip(
    pg: PgConnections,
    turn: NewTurn,
    answers: Sequence[InterruptAnswer],
    now: datetime,
    *,
    owner: str,
    lease_seconds: float,
) -> ClaimedTurn:
    """Create the pending turn leased to ``owner`` (attempt 1), announcing no work, and read
    its progress: the creation statement, then :data:`stores.turn_claims.CLAIMED_PROGRESS`,
    in one transaction and one round trip (PostgreSQL). Refuses as
    :func:`create_turn_in_one_statement` does."""
    lease = _Lease(owner=owner, expires=now + timedelta(seconds=lease_seconds))
    row, progress_rows = await _run_creation(pg, turn, answers, now, lease)
    (progress,) = (progress_of(r) for r in progress_rows if r["id"] == row["id"])
    return ClaimedTurn(turn=turn_sql.record(row), progress=progress)


@dataclass(frozen=True)
class _Lease:
    """Who a claimed creation leases the new turn to, and until when."""

    owner: str
    expires: datetime


async def _run_creation(
    pg: PgConnections,
    turn: NewTurn,
    answers: Sequence[InterruptAnswer],
    now: datetime,
    lease: _Lease | None,
) -> tuple[Row, list[Row]]:
    """Run the creation statement (then, for a leased creation, the progress read in the
    same transaction); the created row and the progress rows, or the typed refusal."""
    opening = message_sql.message_rows(turn.initial_messages)
    answered = [
        {
            "turn_id": answer.turn_id,
            "round": answer.round,
            "ref": answer.ref,
            "answer": answer.answer,
            "decided_by": answer.decided_by,
            # The decision's words for the parent's history, when the answer makes it.
            "summary": decision_summary(answer.answer, answer.decided_by),
        }
        for answer in answers
    ]
    values: dict[str, Any] = {
        "id": turn.id,
        "session_id": turn.session_id,
        "agent": turn.agent,
        "owner": turn.owner,
        "parent_id": turn.parent_id,
        "expected_latest_id": turn.expected_latest_id,
        "input": turn.input.model_dump(mode="json", by_alias=True, exclude_unset=True),
        "history_length": turn.history_length,
        "max_attempts": turn.max_attempts,
        "trace_context": turn.trace_context,
        "custom": json_codec.dumps(turn.custom) if turn.custom is not None else None,
        "artifacts": json_codec.dumps(turn.artifacts) if turn.artifacts else None,
        "app_version": turn.app_version,
        "definition_fingerprint": turn.definition_fingerprint,
        "note": turn.note,
        "now": now,
        # Serialised here: jsonb_to_recordset takes one JSON document per parameter.
        "answers": json_codec.dumps(answered),
        "answer_count": len(answered),
        "messages": json_codec.dumps(opening),
    }
    statement = _CREATE[bool(answered), bool(opening), lease is not None]
    statements = [(statement, values)]
    if lease is None:
        values["work_channel"] = WORK_CHANNEL
    else:
        claimed = claimed_entry(lease.owner, 1, now)
        values |= {
            "lease_owner": lease.owner,
            "lease_expires": lease.expires,
            "claimed_kind": claimed.kind,
            "claimed_note": claimed.note,
        }
        statements.append((CLAIMED_PROGRESS, {}))
    try:
        (row,), *progress = await pg.fetch_together(statements)
    except StatementRefused as exc:
        raise _raced(turn, exc) from exc
    if row["id"] is not None:
        return row, progress[0] if progress else []
    check_creation(turn, answers, _seen(row))
    # Every rule held on the statement's snapshot, yet nothing was written: only a
    # concurrent change between the snapshot and the locks can do that.
    raise StaleSnapshotError(
        f"Session {turn.session_id} changed while the turn was being created. "
        "Continue from the latest snapshot."
    )


def _seen(row: Mapping[str, Any]) -> CreationRefused:
    """What a refused statement reported of the session (the ``seen_*`` columns)."""
    session = None
    if row["seen_session_agent"] is not None:
        session = SessionRecord(
            id=row["seen_session_id"],
            agent=row["seen_session_agent"],
            owner=row["seen_session_owner"],
            created_at=row["seen_session_created_at"],
            updated_at=row["seen_session_updated_at"],
        )
    active = None
    if row["seen_active_id"] is not None:
        active = (row["seen_active_id"], TurnStatus(row["seen_active_status"]))
    calls = [ToolCallRecord.model_validate(call) for call in row["seen_calls"] or ()]
    return CreationRefused(
        session=session,
        active=active,
        latest_id=row["seen_latest_id"],
        id_taken=bool(row["seen_id_taken"]),
        calls={(call.round, call.ref): call for call in calls},
    )


def _raced(turn: NewTurn, refused: StatementRefused) -> AgentError | StatementRefused:
    """The typed error of a creation a concurrent writer beat, by the constraint it hit
    (the rules held on the statement's snapshot; the other writer committed after it)."""
    if refused.constraint == "ux_turns_one_active_per_session":
        return SessionBusyError(
            f"Session {turn.session_id} already has a running turn: another one started "
            "concurrently; wait for it to settle or abort it."
        )
    if refused.constraint == "uq_turns_session_id_seq":
        return StaleSnapshotError(
            f"Session {turn.session_id} moved on: another turn joined it concurrently. "
            "Continue from the latest snapshot."
        )
    if refused.constraint == "pk_turns":
        return InvalidArgumentError(f"Turn {turn.id} already exists.")
    if refused.sqlstate == NOT_NULL_VIOLATION:
        # The statement's answer count leaves the turn's id NULL (see _create_statement).
        return ApprovalNotPendingError(
            f"An interrupt of snapshot {turn.parent_id} was answered concurrently; "
            "it is no longer pending."
        )
    return refused


#: PostgreSQL's SQLSTATE for a NULL in a NOT NULL column.
NOT_NULL_VIOLATION = "23502"

_ANSWERS = """jsonb_to_recordset(CAST(:answers AS jsonb))
             AS a(turn_id text, round integer, ref text, answer jsonb, decided_by text,
                  summary text)"""


# The CTEs run as one statement, all on one snapshot:
# - `ready` is one row when every rule holds on that snapshot: the session is new or the
#   agent's (and the owner's, for a caller acting for one), has no running turn, its latest
#   turn is the one the request was checked against, and every answer decides a call still
#   interrupted, with the recorded decision if an approver made one. Every write below
#   joins it, so a refused request writes nothing at all, and the final SELECT reports what
#   the rules read.
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
# - The `seen_*` columns are read only when nothing was created (a CASE evaluates its
#   subqueries only when they are reached), so a created turn pays nothing for them.
def _create_statement(*, answers: bool, opening: bool, leased: bool) -> sa.TextClause:
    """The statement for a request with or without answers and an opening message: a part
    with nothing to write is left out, so the statement does not even lock its table.
    ``leased``: the turn is inserted leased to its creator (``:lease_owner`` until
    ``:lease_expires``, attempt 1) with its ``claimed`` entry, announces no work, and notes
    its id for the progress read that follows it."""
    answers_pending = (
        f"""
      AND NOT EXISTS (
          SELECT 1 FROM {_ANSWERS}
          LEFT JOIN tool_calls AS c
            ON c.turn_id = :parent_id AND c.turn_id = a.turn_id AND c.round = a.round
           AND c.ref = a.ref
          WHERE c.status IS DISTINCT FROM 'interrupted'
             OR (c.decided_at IS NOT NULL AND c.answer <> a.answer))"""
        if answers
        else ""
    )
    parts = [
        f"""
WITH found_session AS (
    SELECT id, agent, owner, created_at, updated_at FROM sessions WHERE id = :session_id),
active AS (
    SELECT id, status FROM turns
    WHERE session_id = :session_id AND status IN ('pending', 'aborting') LIMIT 1),
latest AS (
    SELECT id FROM turns WHERE session_id = :session_id ORDER BY seq DESC LIMIT 1),
ready AS (
    SELECT 1 AS ready
    WHERE COALESCE(
          (SELECT agent = :agent AND (CAST(:owner AS text) IS NULL OR owner = :owner)
           FROM found_session),
          true)
      AND NOT EXISTS (SELECT 1 FROM active)
      AND (SELECT id FROM latest) IS NOT DISTINCT FROM CAST(:expected_latest_id AS text)
      {answers_pending}),
session AS (
    INSERT INTO sessions (id, agent, owner, created_at, updated_at)
    SELECT :session_id, :agent, :owner, :now, :now FROM ready
    ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at
    RETURNING id),"""
    ]
    if answers:
        parts.append(
            f"""
answered AS (
    UPDATE tool_calls AS c
    SET status = 'answered', answer = a.answer,
        decided_by = CASE WHEN c.decided_at IS NULL THEN a.decided_by ELSE c.decided_by END,
        decided_at = COALESCE(c.decided_at, :now)
    FROM {_ANSWERS}, ready
    -- Answers name calls of the parent. Saying so lets the plan read the parent's journal
    -- by its key; on the answer rows alone it hash-joined every open approval.
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
    # A leased turn starts at its first attempt and lease token, as a claim would leave it.
    attempt = "1" if leased else "0"
    lease_columns = ", lease_owner, lease_expires_at" if leased else ""
    lease_values = ", :lease_owner, :lease_expires" if leased else ""
    parts.append(
        f"""
created AS (
    INSERT INTO turns (id, session_id, seq, agent, parent_id, status, input, history_length,
                       attempts, max_attempts, lease_token, run_after, created_at, updated_at,
                       trace_context, custom, artifacts, app_version,
                       definition_fingerprint{lease_columns})
    SELECT {turn_id},
           session.id,
           (SELECT coalesce(max(seq), 0) + 1 FROM turns WHERE session_id = :session_id),
           :agent, :parent_id, CAST('pending' AS turn_status), :input, :history_length,
           {attempt}, :max_attempts, {attempt}, :now, :now, :now, :trace_context,
           CAST(:custom AS jsonb), CAST(:artifacts AS jsonb), :app_version,
           :definition_fingerprint{lease_values}
    FROM session
    RETURNING *),"""
    )
    if answers:
        # The parent's history gets the decisions the answers make (the calls no approver
        # decided before): this read sees the journal as it was before `answered`.
        parts.append(
            f"""
decided AS (
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT c.turn_id, p.status, 'decided', p.attempts, a.decided_by,
           c.name || ' ' || c.ref || ' ' || a.summary,
           jsonb_build_object('round', c.round, 'ref', c.ref, 'name', c.name, 'answer', a.answer),
           :now
    FROM {_ANSWERS}
    JOIN tool_calls AS c
      ON c.turn_id = :parent_id AND c.turn_id = a.turn_id AND c.round = a.round
     AND c.ref = a.ref
    JOIN turns AS p ON p.id = c.turn_id
    WHERE c.decided_at IS NULL AND EXISTS (SELECT 1 FROM created)),"""
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
    seen_calls = (
        f"""(SELECT jsonb_agg(to_jsonb(c))
                FROM {_ANSWERS}
                JOIN tool_calls AS c
                  ON c.turn_id = :parent_id AND c.turn_id = a.turn_id
                 AND c.round = a.round AND c.ref = a.ref)"""
        if answers
        else "NULL"
    )
    refused = "created.id IS NULL"
    if leased:
        # The creator runs the turn: no worker is told of it. Its claim follows its
        # creation in the history, as a worker's claim would.
        event = """
event AS (
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, at)
    SELECT created.id, CAST('pending' AS turn_status), e.kind, e.attempt, e.actor, e.note, :now
    FROM created,
         (VALUES (1, 'status', 0, CAST(NULL AS text), CAST(:note AS text)),
                 (2, CAST(:claimed_kind AS text), 1, CAST(:lease_owner AS text),
                  CAST(:claimed_note AS text)))
         AS e(step, kind, attempt, actor, note)
    ORDER BY e.step)"""
        noted = f",\n       {_NOTING_CREATED} AS noted"
    else:
        event = """
event AS (
    INSERT INTO turn_events (turn_id, from_status, to_status, attempt, note, at)
    SELECT id, NULL, CAST('pending' AS turn_status), 0, CAST(:note AS text), :now FROM created
    RETURNING pg_notify(:work_channel, turn_id))"""
        noted = ""
    parts.append(
        f"""{event}
SELECT created.*,
       CASE WHEN {refused} THEN (SELECT id FROM found_session) END AS seen_session_id,
       CASE WHEN {refused} THEN (SELECT agent FROM found_session) END AS seen_session_agent,
       CASE WHEN {refused} THEN (SELECT owner FROM found_session) END AS seen_session_owner,
       CASE WHEN {refused} THEN (SELECT created_at FROM found_session) END
           AS seen_session_created_at,
       CASE WHEN {refused} THEN (SELECT updated_at FROM found_session) END
           AS seen_session_updated_at,
       CASE WHEN {refused} THEN (SELECT id FROM active) END AS seen_active_id,
       CASE WHEN {refused} THEN (SELECT CAST(status AS text) FROM active) END
           AS seen_active_status,
       CASE WHEN {refused} THEN (SELECT id FROM latest) END AS seen_latest_id,
       CASE WHEN {refused} THEN EXISTS (SELECT 1 FROM turns WHERE id = :id) END
           AS seen_id_taken,
       CASE WHEN {refused} THEN {seen_calls} END AS seen_calls{noted}
FROM (SELECT 1) AS one LEFT JOIN created ON true
"""
    )
    bound = sa.text("".join(parts)).bindparams(
        sa.bindparam("now", type_=TIMESTAMP),
        sa.bindparam("input", type_=JSON),
        sa.bindparam("trace_context", type_=JSON),
        sa.bindparam("app_version", type_=sa.Text),
        sa.bindparam("definition_fingerprint", type_=sa.Text),
        sa.bindparam("note", type_=sa.Text),
        sa.bindparam("history_length", type_=sa.Integer),
        sa.bindparam("max_attempts", type_=sa.Integer),
    )
    if answers:
        bound = bound.bindparams(sa.bindparam("answer_count", type_=sa.Integer))
    if leased:
        bound = bound.bindparams(sa.bindparam("lease_expires", type_=TIMESTAMP))
    return bound


#: The claimed creation's note of the turn it leased, in the statement's SQL text.
_NOTING_CREATED = sql_text(noting_leased(sa.literal_column("ARRAY[created.id]")))

_CREATE = {
    (answers, opening, leased): PgStatement(
        _create_statement(answers=answers, opening=opening, leased=leased)
    )
    for answers in (False, True)
    for opening in (False, True)
    for leased in (False, True)
}
