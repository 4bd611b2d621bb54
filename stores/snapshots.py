"""SQL for reading a snapshot whole: a turn, its conversation and its journal at one moment.

A resume reads all three before it is queued, on the path from the resume call to the
turn's pickup. On PostgreSQL it is one statement (one round trip, one snapshot of the
database): the conversation and the journal come back as JSON arrays beside the turn's row.
On SQLite the three reads share one transaction, which is as consistent.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store import StoredSnapshot, ToolCallRecord
from stores import messages as message_sql
from stores import tool_calls as call_sql
from stores import turns as turn_sql
from stores.schema import turns

__all__ = ["read_snapshot"]


def read_snapshot(connection: Connection, turn_id: str) -> StoredSnapshot | None:
    """The turn with its conversation and journal, or ``None`` for an unknown turn."""
    if connection.dialect.name != "postgresql":
        turn = turn_sql.get_turn(connection, turn_id)
        if turn is None:
            return None
        return StoredSnapshot(
            turn=turn,
            conversation=message_sql.load_conversation(connection, turn_id) or [],
            journal=call_sql.list_calls(connection, turn_id),
        )
    row = connection.execute(_SNAPSHOT, {"turn_id": turn_id}).first()
    if row is None:
        return None
    m = row._mapping
    conversation: list[Any] = m["conversation"] or []
    journal: list[dict[str, Any]] = m["journal"] or []
    return StoredSnapshot(
        turn=turn_sql.record(row),
        conversation=message_sql.assemble_conversation(conversation),
        # JSON carries timestamps as ISO 8601 text with their offset: the model parses them.
        journal=[ToolCallRecord.model_validate(call) for call in journal],
    )


# The ancestry walk is the conversation query's (stores/messages.py); its rows are folded
# into one JSON array in the same order, as [turn id, history_length, role, content,
# metadata]. json_agg of whole tool_calls rows keeps the column names as keys.
_SNAPSHOT = sa.text(
    """
WITH RECURSIVE ancestry AS (
    SELECT id, parent_id, history_length, 0 AS depth FROM turns WHERE id = :turn_id
    UNION ALL
    SELECT parent.id, parent.parent_id, parent.history_length, ancestry.depth + 1
    FROM turns AS parent JOIN ancestry ON parent.id = ancestry.parent_id)
SELECT turns.*,
       (SELECT json_agg(json_build_array(a.id, a.history_length, m.role, m.content,
                                         m.metadata)
                        ORDER BY a.depth DESC, m.round, m.position)
        FROM ancestry AS a
        LEFT JOIN messages AS m ON m.turn_id = a.id AND m.committed) AS conversation,
       (SELECT json_agg(c ORDER BY c.round, c.ref)
        FROM tool_calls AS c WHERE c.turn_id = turns.id) AS journal
FROM turns WHERE turns.id = :turn_id
"""
).columns(
    *turns.columns,
    sa.column("conversation", sa.JSON),
    sa.column("journal", sa.JSON),
)
