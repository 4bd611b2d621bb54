"""The lease holder's writes on PostgreSQL, each one statement.

A worker writes a turn's progress many times: a round opened or closed with its journal rows,
a tool call's outcome, the settling transition with the last round. Each is one data-modifying
statement on an autocommit connection, one round trip: a ``found`` CTE reads and locks the
turn's row, a fence CTE keeps it only if the caller's lease token (and the expected status)
still hold, and every write joins the fence, so a caller who lost its lease writes nothing at
all. The statement then reports the status and token it found, from which
:mod:`engine.store.rules` raises the precise error.

The rules are SQLite's transactions' own (:func:`stores.turns.transition`,
:func:`stores.turns.fence`): the same lock modes (``FOR SHARE`` for a journal write, so a
competing claim waits until it commits; ``FOR NO KEY UPDATE`` when token usage is added to the
row; ``FOR UPDATE`` for a transition), the same values (``transition_changes`` decides what a
transition sets), the same ``turn_events`` row and notifications.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any, NamedTuple

import sqlalchemy as sa

from engine.errors import LeaseLostError, StoreError
from engine.model import ModelUsage
from engine.status import TurnStatus, can_transition
from engine.store import (
    RoundRecord,
    StoredSnapshot,
    ToolCallRecord,
    Transition,
    TurnError,
    TurnRecord,
)
from engine.store.rules import LeaseState, check_lease, transition_changes
from stores import json_codec
from stores import messages as message_sql
from stores import snapshots as snapshot_sql
from stores import turn_claims as claim_sql
from stores import turns as turn_sql
from stores.history import journal_history_ctes
from stores.notify import CHANGE_CHANNEL, WORK_CHANNEL
from stores.pg import PgConnections, PgStatement, StatementRefused
from stores.schema import ACTIVE, TIMESTAMP, turns
from stores.turn_claims import CheckedClaim, ClaimRequest

__all__ = ["save_fenced", "transition_fenced"]

logger = logging.getLogger("turnstile.store")

_ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)

#: jsonb_to_recordset's column list for journal rows: the ``tool_calls`` columns a store
#: write sets (``turn_id`` comes from the fence, ``created_at`` is the write's time).
_CALL_FIELDS = (
    "round integer, ref text, name text, input jsonb, status text, output jsonb, "
    "interrupt jsonb, error jsonb, idempotency_key text, resumed jsonb, answer jsonb, "
    "decided_by text, decided_at timestamptz, started_at timestamptz, "
    "finished_at timestamptz, deadline timestamptz, effects jsonb"
)
_CALL_UPDATED = (
    "name",
    "input",
    "status",
    "output",
    "interrupt",
    "error",
    "idempotency_key",
    "resumed",
    "answer",
    "decided_by",
    "decided_at",
    "started_at",
    "finished_at",
    "deadline",
    "effects",
)


def _writes(source: str, *, round: bool, calls: bool, actor: str) -> list[str]:
    """The CTEs writing a round's messages and journal rows, each joined to ``source`` (the
    fence: zero rows when the lease is lost, and then nothing is written). ``source`` holds
    the turn as the statement leaves it (``id``, ``status``, ``attempts``) and in column
    ``actor`` the lease owner it fenced on, who the journal's history entries name."""
    parts = []
    if round:
        # Upsert then trim, rather than delete then insert: in one statement the two
        # touch disjoint rows, so neither depends on seeing the other's effect. Each row
        # names its round: one write may carry two rounds (see save_fenced's `earlier`).
        parts.append(
            f"""
saved AS (
    INSERT INTO messages (turn_id, round, position, role, content, metadata, committed,
                          created_at)
    SELECT {source}.id, m.round, m.position, m.role, m.content, m.metadata, m.committed,
           :saved_at
    FROM {source}, jsonb_to_recordset(CAST(:messages AS jsonb))
                       AS m(round integer, position integer, role text, content jsonb,
                            metadata jsonb, committed boolean)
    ON CONFLICT (turn_id, round, position) DO UPDATE
    SET role = excluded.role, content = excluded.content, metadata = excluded.metadata,
        committed = excluded.committed, created_at = excluded.created_at),
trimmed AS (
    DELETE FROM messages
    USING jsonb_to_recordset(CAST(:round_sizes AS jsonb)) AS r(round integer, size integer)
    WHERE messages.turn_id = :turn_id AND messages.round = r.round
      AND messages.position >= r.size
      AND EXISTS (SELECT 1 FROM {source}))"""
        )
    if calls:
        updated = ", ".join(f"{column} = excluded.{column}" for column in _CALL_UPDATED)
        upsert = f"""
    INSERT INTO tool_calls (turn_id, round, ref, name, input, status, output, interrupt,
                            error, idempotency_key, resumed, answer, decided_by, decided_at,
                            started_at, finished_at, deadline, effects, created_at)
    SELECT {source}.id, c.round, c.ref, c.name, c.input, CAST(c.status AS tool_call_status),
           c.output, c.interrupt, c.error, c.idempotency_key, c.resumed, c.answer,
           c.decided_by, c.decided_at, c.started_at, c.finished_at, c.deadline, c.effects,
           :saved_at
    FROM {source}, jsonb_to_recordset(CAST(:calls AS jsonb)) AS c({_CALL_FIELDS})
    -- created_at keeps the first write's time: an approval's age is measured from it.
    ON CONFLICT (turn_id, round, ref) DO UPDATE SET {updated}"""
        parts += journal_history_ctes(upsert, turn=source, actor=actor)
    return parts


def _write_params(
    turn_id: str,
    rounds: Sequence[RoundRecord],
    calls: Sequence[ToolCallRecord],
    saved_at: datetime,
) -> dict[str, Any]:
    params: dict[str, Any] = {"turn_id": turn_id, "saved_at": saved_at}
    if rounds:
        params.update(
            messages=json_codec.dumps(
                [
                    {**row, "round": r.round, "committed": r.committed}
                    for r in rounds
                    for row in message_sql.message_rows(r.messages)
                ]
            ),
            round_sizes=json_codec.dumps(
                [{"round": r.round, "size": len(r.messages)} for r in rounds]
            ),
        )
    if calls:
        params["calls"] = json_codec.dumps(
            [call.model_dump(mode="json", exclude={"turn_id", "created_at"}) for call in calls]
        )
    return params


def _typed(sql: str) -> sa.TextClause:
    """The statement with its timestamp parameters typed (UTC, as every column we write)."""
    names = [name for name in ("saved_at", "now") if f":{name}" in sql]
    return sa.text(sql).bindparams(*(sa.bindparam(name, type_=TIMESTAMP) for name in names))


# Only reported counts are added: a turn whose model reports nothing keeps NULL.
_ADD_USAGE = """
    input_tokens = CASE WHEN CAST(:input_tokens AS integer) IS NULL THEN input_tokens
                        ELSE coalesce(input_tokens, 0) + :input_tokens END,
    output_tokens = CASE WHEN CAST(:output_tokens AS integer) IS NULL THEN output_tokens
                         ELSE coalesce(output_tokens, 0) + :output_tokens END"""


# The session state a committed round carries (see _state_params).
_SET_STATE = "custom = CAST(:custom AS jsonb), artifacts = CAST(:artifacts AS jsonb)"


def _state_params(rounds: Sequence[RoundRecord]) -> dict[str, Any] | None:
    """The ``custom`` / ``artifacts`` parameters of the last committed round of ``rounds``
    that changed the session state; ``None`` when none did."""
    states = [r.state for r in rounds if r.committed and r.state is not None]
    if not states:
        return None
    state = states[-1]
    return {
        "custom": json_codec.dumps(state.custom) if state.custom is not None else None,
        "artifacts": json_codec.dumps(state.artifacts_wire()),
    }


def _counted(usage: ModelUsage | None) -> bool:
    return usage is not None and (usage.input_tokens is not None or usage.output_tokens is not None)


# -- journal writes: save_round and record_call ------------------------------------------


async def save_fenced(
    pg: PgConnections,
    turn_id: str,
    lease_token: int,
    *,
    round: RoundRecord | None,
    calls: Sequence[ToolCallRecord],
    usage: ModelUsage | None,
    now: datetime,
    earlier: RoundRecord | None = None,
) -> None:
    """Write a round and/or journal rows (and add token usage) if ``lease_token`` holds the
    running turn; otherwise write nothing and raise the fence's error. ``earlier``: another
    round written by the same statement."""
    counted = _counted(usage)
    rounds = [r for r in (earlier, round) if r is not None]
    params = _write_params(turn_id, rounds, calls, now)
    params["lease_token"] = lease_token
    if counted:
        assert usage is not None
        params["input_tokens"] = usage.input_tokens
        params["output_tokens"] = usage.output_tokens
    state = _state_params(rounds)
    if state is not None:
        params.update(state)
    statement = _save_statement(
        round=bool(rounds), calls=bool(calls), usage=counted, state=state is not None
    )
    (row,) = await pg.fetch(statement, params)
    if not row["fenced"]:
        check_lease(turn_id, lease_token, _found(row))
        raise LeaseLostError(turn_id, f"Lease {lease_token} on turn {turn_id} was lost.")


def _found(row: Mapping[str, Any]) -> LeaseState | None:
    """The turn's status and lease token as the statement found them (``None``: no turn)."""
    if row["found_status"] is None:
        return None
    return LeaseState(TurnStatus(row["found_status"]), row["found_token"])


#: The final SELECT of a fenced statement when nothing else is read: whether the fence held,
#: and what the guard found (a row even when the turn does not exist).
_REPORT = """SELECT (SELECT count(*) FROM fence) AS fenced,
       found.status AS found_status, found.lease_token AS found_token
FROM (SELECT 1) AS one LEFT JOIN found ON true
"""


@cache
def _save_statement(*, round: bool, calls: bool, usage: bool, state: bool) -> PgStatement:
    # Adding usage or state updates the row: lock it for that from the start (a share lock
    # upgraded later could deadlock with a heartbeat queued behind it), as SQLite's form does.
    lock = "FOR NO KEY UPDATE" if usage or state else "FOR SHARE"
    ctes = [
        f"""
found AS (
    SELECT id, status, lease_token, attempts, lease_owner
    FROM turns WHERE id = :turn_id {lock})""",
        f"""
fence AS (
    SELECT id, status, attempts, lease_owner FROM found
    WHERE lease_token = :lease_token AND status IN ({_ACTIVE_SQL}))""",
    ]
    sets = [s for s, wanted in ((_ADD_USAGE, usage), (_SET_STATE, state)) if wanted]
    if sets:
        # One UPDATE: two in one statement must not touch the same row.
        ctes.append(
            f"""
touched AS (UPDATE turns SET {", ".join(sets)} FROM fence WHERE turns.id = fence.id)"""
        )
    ctes += _writes("fence", round=round, calls=calls, actor="lease_owner")
    sql = f"WITH {','.join(ctes)}\n{_REPORT}"
    return PgStatement(_typed(sql))


# -- transitions ---------------------------------------------------------------------------


async def transition_fenced(
    pg: PgConnections,
    turn_id: str,
    change: Transition,
    *,
    now: datetime,
    saved_at: datetime,
    claim: ClaimRequest | None = None,
    read_back: bool = False,
) -> Settled:
    """The guarded transition, with the round and journal rows it settles with, as one
    statement: the moved turn, or ``None`` (nothing written) with the status and lease token
    the guard found (``None``: no such turn) when the turn is not in an expected status
    under the change's lease token, or the state machine has no such edge from it.

    With ``claim`` (the request of ``change.then_claim``), the claim follows in the same
    round trip and transaction (a pipeline: one commit, one WAL flush) and its result is
    returned too. It runs whether or not the transition applied: the slot it fills is free
    either way. With ``read_back``, the turn's snapshot is read last in the same
    transaction, as it stands once the transition applied (for a waiter of this process)."""
    round, calls, usage = change.round, change.calls, change.usage
    # The token is set in SQL (the found one plus one): the value passed here is unused.
    changes = transition_changes(change, 0, now)
    changes.pop("lease_token", None)
    params = _write_params(turn_id, [round] if round is not None else [], calls, saved_at)
    params.update(lease_token=change.lease_token, now=now, note=change.note)
    for key, value in changes.items():
        if isinstance(value, StrEnum):
            value = value.value
        elif isinstance(value, TurnError):
            value = json_codec.dumps(value.model_dump(mode="json"))
        params[f"set_{key}"] = value
    counted = _counted(usage)
    if counted:
        assert usage is not None
        params.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    state = _state_params([round] if round is not None else [])
    if state is not None:
        params.update(state)
    pending = change.new is TurnStatus.PENDING
    notify = (CHANGE_CHANNEL, WORK_CHANNEL) if pending else (CHANGE_CHANNEL,)
    statement = _transition_statement(
        # Only statuses with an edge to the new one qualify: from the others, the refusal
        # reports the status and the rules name the missing edge.
        movable=tuple(sorted(s.value for s in change.expected if can_transition(s, change.new))),
        columns=tuple(sorted(changes)),
        release=change.new is not TurnStatus.ABORTING,
        fenced=change.lease_token is not None,
        usage=counted,
        state=state is not None,
        notify=notify,
        round=round is not None,
        calls=bool(calls),
    )
    checked = None
    read = [snapshot_sql.snapshot_query(turn_id)] if read_back else []
    if claim is not None:
        try:
            rows, claim_rows, progress_rows, *snapshot_rows = await pg.fetch_together(
                [(statement, params), *claim_sql.checked_claim_queries(claim), *read]
            )
            checked = claim_sql.checked_claim_of(claim_rows, progress_rows)
        except StatementRefused:
            raise
        except StoreError as exc:
            # Whichever statement failed, all rolled back. A claim must never cost the
            # settle: settle alone (its own failure raises again from there).
            logger.warning("turn %s: settle with its follow-on claim failed (%s)", turn_id, exc)
            claim = None
    if claim is None:
        rows, *snapshot_rows = await pg.fetch_together([(statement, params), *read])
    (row,) = rows
    if row["id"] is None:
        return Settled(None, _found(row), checked)
    snapshot = snapshot_sql.snapshot_of(snapshot_rows[0]) if snapshot_rows else None
    return Settled(turn_sql.record(row), None, checked, snapshot)


class Settled(NamedTuple):
    """What :func:`transition_fenced` did."""

    #: The moved turn, or ``None`` when the guard refused (nothing written).
    moved: TurnRecord | None
    #: What the refusing guard found (``None`` when it moved, or there is no such turn).
    found: LeaseState | None
    #: The follow-on claim's result, when one was sent and ran.
    checked: CheckedClaim | None
    #: The turn's snapshot as the transition left it, when read back.
    snapshot: StoredSnapshot | None = None


# How each column a transition sets is written (see transition_changes).
_SET = {
    "status": "CAST(:set_status AS turn_status)",
    "error": "CAST(:set_error AS jsonb)",
    "updated_at": "CAST(:set_updated_at AS timestamptz)",
    "settled_at": "CAST(:set_settled_at AS timestamptz)",
    "run_after": "CAST(:set_run_after AS timestamptz)",
    "lease_expires_at": "CAST(:set_lease_expires_at AS timestamptz)",
}


@cache
def _transition_statement(
    *,
    movable: tuple[str, ...],
    columns: tuple[str, ...],
    release: bool,
    fenced: bool,
    notify: tuple[str, ...],
    round: bool,
    calls: bool,
    usage: bool,
    state: bool = False,
) -> PgStatement:
    sets = ", ".join(f"{column} = {_SET.get(column, ':set_' + column)}" for column in columns)
    if release:
        # Settling, or handing the turn back, moves the token on (see transition_changes).
        sets += ", lease_token = turns.lease_token + 1"
    if usage:
        sets += f", {_ADD_USAGE}"
    if state:
        sets += f", {_SET_STATE}"
    statuses = ", ".join(f"'{status}'" for status in movable) or "NULL"
    token = "lease_token = :lease_token AND " if fenced else ""
    notifications = ", ".join(f"pg_notify('{channel}', turn_id)" for channel in notify)
    # Only the lease holder's own transition is its act (an abort request is not).
    actor = "from_owner" if fenced else "NULL"
    # `found` locks the row (FOR UPDATE, as SQLite's form's first read) and reads it as it
    # is once locked; `current` keeps it if the guard holds, with the status, attempt and
    # worker the transition leaves, for its turn_events row.
    ctes = [
        """
found AS (
    SELECT id, status, lease_token, attempts, lease_owner
    FROM turns WHERE id = :turn_id FOR UPDATE)""",
        f"""
current AS (
    SELECT id, status, attempts, lease_owner FROM found WHERE {token}status IN ({statuses}))""",
        f"""
moved AS (
    UPDATE turns SET {sets}
    FROM current WHERE turns.id = current.id
    RETURNING turns.*, current.status AS from_status, current.attempts AS from_attempt,
              current.lease_owner AS from_owner)""",
        f"""
event AS (
    INSERT INTO turn_events (turn_id, from_status, to_status, attempt, note, at, actor)
    SELECT id, from_status, status, from_attempt, :note, :now, {actor} FROM moved
    RETURNING {notifications})""",
        *_writes("moved", round=round, calls=calls, actor="from_owner"),
    ]
    # A data-modifying CTE runs to completion whether or not the query reads it: the event
    # row and its notifications need no reference here.
    sql = f"""WITH {",".join(ctes)}
SELECT {", ".join("moved." + column.name for column in turns.columns)},
       found.status AS found_status, found.lease_token AS found_token
FROM (SELECT 1) AS one LEFT JOIN found ON true LEFT JOIN moved ON true
"""
    return PgStatement(_typed(sql))
