"""Appending to a turn's history (``turn_events``) from inside a writer's transaction.

The history is append-only (a trigger refuses any UPDATE of it): every change of a turn adds
its entries in the transaction that makes it. Status transitions are written by
:mod:`stores.turns` and :mod:`stores.fenced` with the transition, PostgreSQL's claims by the
claim statement (:mod:`stores.turn_claims`), tool calls by the statements that write the
journal (:func:`journal_history_ctes` on PostgreSQL, :func:`append_entries` after SQLite's
upsert); everything else (SQLite's claims, decisions, votes, assignment changes, and whatever
else a caller records, e.g. a webhook delivery) goes through :func:`append_history`, which
adds no statement of its own beyond the one INSERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store.history import HistoryEntry
from stores.schema import JSON, TIMESTAMP, turn_events, turns

__all__ = ["append_entries", "append_history", "journal_history_ctes"]


def append_history(connection: Connection, turn_id: str, entry: HistoryEntry) -> None:
    """Append ``entry`` to the history of turn ``turn_id``, in ``connection``'s open
    transaction (it commits or rolls back with the change it records), stamped with the
    turn's status and (unless the entry names one) its current attempt. Nothing is written
    for an unknown turn."""
    append_entries(connection, turn_id, [entry])


def append_entries(connection: Connection, turn_id: str, entries: Sequence[HistoryEntry]) -> None:
    """Append ``entries``, in order, as :func:`append_history` appends one (one statement,
    executed once per entry; none when there are none)."""
    if entries:
        connection.execute(_APPEND, [_values(turn_id, entry) for entry in entries])


def _values(turn_id: str, entry: HistoryEntry) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "kind": entry.kind,
        "attempt": entry.attempt,
        "actor": entry.actor,
        "note": entry.note,
        "detail": entry.detail,
        "at": entry.at,
    }


_APPEND = sa.insert(turn_events).from_select(
    ["turn_id", "to_status", "kind", "attempt", "actor", "note", "detail", "at"],
    sa.select(
        turns.c.id,
        turns.c.status,
        sa.bindparam("kind", type_=sa.Text),
        sa.func.coalesce(sa.bindparam("attempt", type_=sa.Integer), turns.c.attempts),
        sa.bindparam("actor", type_=sa.Text),
        sa.bindparam("note", type_=sa.Text),
        sa.bindparam("detail", type_=JSON),
        sa.bindparam("at", type_=TIMESTAMP),
    ).where(turns.c.id == sa.bindparam("turn_id")),
)


# -- The journal's entries on PostgreSQL, written by the statement that writes the journal ----

#: The statuses ending a run of a call (engine.store.history.FINISHED_KINDS).
_ENDING = "('done', 'failed', 'interrupted')"


def journal_history_ctes(upsert: str, *, turn: str, actor: str) -> tuple[str, str, str]:
    """The CTEs of a PostgreSQL statement that writes journal rows and appends the entries
    :func:`engine.store.history.call_entries` gives for them, in the same statement.

    ``upsert`` is the body of the journal's ``INSERT … ON CONFLICT DO UPDATE`` (without
    ``RETURNING``) writing the rows of the ``:calls`` parameter for turn ``:turn_id``;
    ``turn`` names the CTE that holds the turn as the statement leaves it (``id``,
    ``status``, ``attempts``: zero rows when nothing is written) and ``actor`` its column
    holding the lease owner the statement fenced on. Returned in the order the ``WITH``
    clause lists them: ``journal_before``, ``journal``, ``journal_history``.

    ``journal_before`` reads the rows as they were: every part of one statement sees the
    same snapshot, so it is the state before the upsert, as a trigger's ``OLD`` is. An entry
    is due when the call's start moved (but for a call this write also pauses) or its status
    became an ending one; a row rewritten unchanged adds none.
    """
    before = """
journal_before AS (
    SELECT c.round, c.ref, c.status, c.started_at
    FROM jsonb_to_recordset(CAST(:calls AS jsonb)) AS k(round integer, ref text)
    JOIN tool_calls AS c ON c.turn_id = :turn_id AND c.round = k.round AND c.ref = k.ref)"""
    journal = f"""
journal AS ({upsert}
    RETURNING turn_id, round, ref, name, status, started_at, finished_at)"""
    history = f"""
journal_history AS (
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT w.turn_id, {turn}.status, e.kind, {turn}.attempts, {turn}.{actor},
           w.name || ' ' || w.ref,
           jsonb_build_object('round', w.round, 'ref', w.ref, 'name', w.name), e.at
    FROM journal AS w
    CROSS JOIN {turn}
    LEFT JOIN journal_before AS b ON b.round = w.round AND b.ref = w.ref
    CROSS JOIN LATERAL (VALUES
        (1, 'tool started', w.started_at,
         w.started_at IS NOT NULL AND w.started_at IS DISTINCT FROM b.started_at
         AND NOT (w.status = 'interrupted' AND w.status IS DISTINCT FROM b.status)),
        (2, CASE WHEN w.status = 'interrupted' THEN 'paused'
                 ELSE 'tool ' || CAST(w.status AS text) END,
         COALESCE(w.finished_at, now()),
         w.status IN {_ENDING} AND w.status IS DISTINCT FROM b.status))
        AS e(position, kind, at, due)
    WHERE e.due
    -- A call's start before its end, as the entries of one moment sort by their id.
    ORDER BY w.round, w.ref, e.position)"""
    return before, journal, history
