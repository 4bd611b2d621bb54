"""SQL for whole reads: a snapshot (a turn, its conversation and its journal) for a resume or
a waiting caller, and a turn's progress for the worker running it, each at one moment (a
claim reads its leased turns' progress with these columns, :mod:`stores.turn_claims`).

A resume reads all three before it is queued, on the path from the resume call to the
turn's pickup. On PostgreSQL it is one statement (one round trip, one snapshot of the
database): the conversation and the journal come back as JSON arrays beside the turn's row.
On SQLite the three reads share one transaction, which is as consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store import StoredSnapshot, ToolCallRecord, TurnProgress, TurnRecord
from stores import messages as message_sql
from stores import tool_calls as call_sql
from stores import turns as turn_sql
from stores.pg import PgConnections, PgStatement

__all__ = [
    "progress_columns",
    "progress_of",
    "progress_of_turn",
    "progress_walks",
    "read_progress",
    "read_progress_in_one_statement",
    "read_snapshot",
    "read_snapshot_in_one_statement",
    "snapshot_of",
    "snapshot_query",
]


def read_snapshot(connection: Connection, turn_id: str) -> StoredSnapshot | None:
    """The turn with its conversation and journal, or ``None`` for an unknown turn (SQLite:
    three reads in the caller's transaction)."""
    turn = turn_sql.get_turn(connection, turn_id)
    if turn is None:
        return None
    return StoredSnapshot(
        turn=turn,
        conversation=message_sql.load_conversation(connection, turn_id) or [],
        journal=call_sql.list_calls(connection, turn_id),
    )


async def read_snapshot_in_one_statement(pg: PgConnections, turn_id: str) -> StoredSnapshot | None:
    """:func:`read_snapshot` on PostgreSQL: one statement, one snapshot of the database."""
    return snapshot_of(await pg.fetch(*snapshot_query(turn_id)))


def snapshot_query(turn_id: str) -> tuple[PgStatement, dict[str, Any]]:
    """The statement of :func:`read_snapshot_in_one_statement` and its values, for a caller
    that sends it in a pipeline of its own (a settle reading what it settled)."""
    return _SNAPSHOT, {"turn_id": turn_id}


def snapshot_of(rows: Sequence[Mapping[str, Any]]) -> StoredSnapshot | None:
    """The snapshot in the rows of :func:`snapshot_query` (``None``: no such turn)."""
    if not rows:
        return None
    (row,) = rows
    return StoredSnapshot(
        turn=turn_sql.record(row),
        conversation=message_sql.assemble_conversation(row["conversation"] or []),
        journal=_journal_of(row["journal"]),
    )


def _journal_of(rows: list[dict[str, Any]] | None) -> list[ToolCallRecord]:
    """The journal rows of a :func:`_journal_json` column (``None``: no rows). JSON carries
    timestamps as ISO 8601 text with their offset: the model parses them."""
    return [ToolCallRecord.model_validate(row) for row in rows or []]


def _journal_json(turn: str) -> str:
    """The journal of ``turn`` (an SQL expression) as a JSON array of whole rows (the
    column names are the keys), by round then ref."""
    return f"""(SELECT json_agg(c ORDER BY c.round, c.ref)
        FROM tool_calls AS c WHERE c.turn_id = {turn})"""


# The conversation walk of stores/messages.py, folded into JSON beside the turn's row.
_SNAPSHOT = PgStatement(
    sa.text(
        message_sql.ancestry_cte(
            "SELECT id, parent_id, history_length, 0 AS depth FROM turns WHERE id = :turn_id"
        )
        + f"""
SELECT turns.*, {message_sql.CONVERSATION_JSON} AS conversation,
       {_journal_json("turns.id")} AS journal
FROM turns WHERE turns.id = :turn_id
"""
    )
)


def read_progress(connection: Connection, turn_id: str) -> TurnProgress | None:
    """The parent's conversation and journal, the turn's rounds and journal; ``None`` for an
    unknown turn (SQLite: reads in the caller's transaction)."""
    turn = turn_sql.get_turn(connection, turn_id)
    return None if turn is None else progress_of_turn(connection, turn)


def progress_of_turn(connection: Connection, turn: TurnRecord) -> TurnProgress:
    """:func:`read_progress` of ``turn``, read already (e.g. by the claim that leased it)."""
    parent = turn.parent_id
    return TurnProgress(
        parent_conversation=(message_sql.load_conversation(connection, parent) or [])
        if parent
        else [],
        parent_journal=call_sql.list_calls(connection, parent) if parent else [],
        rounds=message_sql.load_rounds(connection, turn.id),
        journal=call_sql.list_calls(connection, turn.id),
    )


async def read_progress_in_one_statement(pg: PgConnections, turn_id: str) -> TurnProgress | None:
    """:func:`read_progress` on PostgreSQL: one statement, one snapshot of the database."""
    rows = await pg.fetch(_PROGRESS, {"turn_id": turn_id})
    return progress_of(rows[0]) if rows else None


def progress_of(row: Mapping[str, Any]) -> TurnProgress:
    """The :class:`TurnProgress` in a row with :func:`progress_columns`."""
    return TurnProgress(
        parent_conversation=message_sql.assemble_conversation(row["conversation"] or []),
        parent_journal=_journal_of(row["parent_journal"]),
        rounds=message_sql.assemble_rounds(row["rounds"] or []),
        journal=_journal_of(row["journal"]),
    )


def progress_columns(turn: str, *, chains: bool = False) -> str:
    """The SELECT list of a turn's progress (``conversation``, ``parent_journal``,
    ``rounds``, ``journal``), for ``turn``, an SQL row with ``id`` and ``parent_id``, and
    an ``ancestry`` walk starting at its parent — with ``chains``, the walks of
    :func:`progress_walks`, of which the turn's is the one named by its id. The turn's own
    messages come as ``[round, role, content, metadata, committed]`` in round and position
    order."""
    conversation = (
        message_sql.conversation_json(f"a.chain = {turn}.id")
        if chains
        else message_sql.CONVERSATION_JSON
    )
    return f"""{conversation} AS conversation,
       {_journal_json(turn + ".parent_id")} AS parent_journal,
       (SELECT json_agg(json_build_array(m.round, m.role, m.content, m.metadata, m.committed)
                        ORDER BY m.round, m.position)
        FROM messages AS m WHERE m.turn_id = {turn}.id) AS rounds,
       {_journal_json(turn + ".id")} AS journal"""


def progress_walks(rows: str) -> str:
    """The body of an ``ancestry`` walk (``chain``, ``id``, ``parent_id``,
    ``history_length``, ``depth``) from the parent of each row of ``rows`` (an SQL table
    with ``id`` and ``parent_id``, e.g. a claim's leased turns), each walk named by the row's
    id: what :func:`progress_columns` with ``chains`` reads."""
    return message_sql.ancestry_walk(
        f"""SELECT {rows}.id AS chain, parent.id, parent.parent_id, parent.history_length,
           0 AS depth
    FROM {rows} JOIN LATERAL (
        SELECT id, parent_id, history_length FROM turns WHERE turns.id = {rows}.parent_id
        OFFSET 0
    ) AS parent ON true""",
        chains=True,
    )


def _progress_start(parent_id: str) -> str:
    """The start of the ``ancestry`` walk of a progress: the turn whose id is the SQL
    expression ``parent_id`` (the progressing turn's parent)."""
    return (
        "SELECT parent.id, parent.parent_id, parent.history_length, 0 AS depth "
        f"FROM turns AS parent WHERE parent.id = {parent_id}"
    )


# As _SNAPSHOT, with the ancestry walk starting at the turn's parent.
_PROGRESS = PgStatement(
    sa.text(
        message_sql.ancestry_cte(
            _progress_start("(SELECT parent_id FROM turns WHERE id = :turn_id)")
        )
        + f"""
SELECT {progress_columns("turns")}
FROM turns WHERE turns.id = :turn_id
"""
    )
)
