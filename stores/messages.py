"""SQL for the conversation: ``messages``, saved per round of a turn."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.conversation.parts import Message
from engine.store import RoundRecord
from stores.schema import messages, turns

__all__ = [
    "ANCESTRY_MESSAGES",
    "CONVERSATION_JSON",
    "ancestry_cte",
    "ancestry_walk",
    "assemble_conversation",
    "assemble_rounds",
    "conversation_json",
    "load_conversation",
    "load_rounds",
    "message_rows",
    "save_round",
]


def save_round(
    connection: Connection,
    turn_id: str,
    round_: RoundRecord,
    now: datetime,
    *,
    replace: bool = True,
) -> None:
    """Replace the messages of one round (a round is rewritten when it closes).

    ``replace=False`` skips deleting earlier rows, for a round that cannot have any yet (the
    round 0 of a turn being created).
    """
    if replace:
        connection.execute(_DELETE_ROUND, {"turn_id": turn_id, "round": round_.round})
    if round_.messages:
        connection.execute(
            sa.insert(messages),
            [
                {
                    **row,
                    "turn_id": turn_id,
                    "round": round_.round,
                    "committed": round_.committed,
                    "created_at": now,
                }
                for row in message_rows(round_.messages)
            ],
        )


def message_rows(round_messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` columns that come from a round's messages themselves: ``position``,
    ``role``, ``content`` (wire parts) and ``metadata``."""
    return [
        {
            "position": position,
            "role": message.role,
            "content": [part.to_wire() for part in message.content],
            "metadata": message.metadata,
        }
        for position, message in enumerate(round_messages)
    ]


def _message(role: Any, content: Any, metadata: Any) -> Message:
    wire: dict[str, object] = {"role": role, "content": content}
    if metadata is not None:
        wire["metadata"] = metadata
    return Message.model_validate(wire)


def load_rounds(connection: Connection, turn_id: str) -> list[RoundRecord]:
    """Every round of the turn, committed or not, in order."""
    rows = connection.execute(_ROUNDS, {"turn_id": turn_id}).all()
    return assemble_rounds(
        (m["round"], m["role"], m["content"], m["metadata"], m["committed"])
        for m in (row._mapping for row in rows)
    )


def assemble_rounds(rows: Iterable[Sequence[Any]]) -> list[RoundRecord]:
    """Rounds from message rows ``(round, role, content, metadata, committed)`` in round and
    position order."""
    grouped: dict[int, list[Sequence[Any]]] = defaultdict(list)
    for row in rows:
        grouped[row[0]].append(row)
    return [
        RoundRecord(
            round=number,
            messages=[_message(role, content, metadata) for _, role, content, metadata, _ in group],
            committed=bool(group[0][4]),
        )
        for number, group in sorted(grouped.items())
    ]


def load_conversation(connection: Connection, turn_id: str) -> list[Message] | None:
    """The turn's conversation as of its committed rounds, or ``None`` for an unknown turn.

    One statement: the ancestry (the turn and its parents, by a recursive CTE) joined with
    the committed messages of each (see :func:`assemble_conversation`).
    """
    statement = _CONVERSATION_PG if connection.dialect.name == "postgresql" else _CONVERSATION
    rows = connection.execute(statement, {"turn_id": turn_id}).all()
    if not rows:
        return None
    return assemble_conversation(
        (m["chain_id"], m["history_length"], m["role"], m["content"], m["metadata"])
        for m in (row._mapping for row in rows)
    )


def assemble_conversation(rows: Iterable[Sequence[Any]]) -> list[Message]:
    """A conversation from its ancestry's rows ``(turn id, history_length, role, content,
    metadata)``, root first, each turn's messages in order (``role`` None: a turn without
    committed messages). Walking root first, each turn keeps the first ``history_length``
    messages of its parent's conversation, then adds its own."""
    result: list[Message] = []
    current: str | None = None
    for chain_id, history_length, role, content, metadata in rows:
        if chain_id != current:  # the next turn of the chain
            current = chain_id
            result = result[:history_length]
        if role is not None:
            result.append(_message(role, content, metadata))
    return result


# Built once, with bound parameters (statement construction costs more CPU than the query).
_DELETE_ROUND = sa.delete(messages).where(
    messages.c.turn_id == sa.bindparam("turn_id"), messages.c.round == sa.bindparam("round")
)
_ROUNDS = (
    sa.select(messages)
    .where(messages.c.turn_id == sa.bindparam("turn_id"))
    .order_by(messages.c.round, messages.c.position)
)


def _ancestry() -> sa.CTE:
    ancestry = (
        sa.select(
            turns.c.id, turns.c.parent_id, turns.c.history_length, sa.literal(0).label("depth")
        )
        .where(turns.c.id == sa.bindparam("turn_id"))
        .cte("ancestry", recursive=True)
    )
    parent = turns.alias("parent")
    return ancestry.union_all(
        sa.select(
            parent.c.id, parent.c.parent_id, parent.c.history_length, ancestry.c.depth + 1
        ).where(parent.c.id == ancestry.c.parent_id)
    )


def _conversation_statement() -> sa.Select[tuple[object, ...]]:
    ancestry = _ancestry()
    return (
        sa.select(
            ancestry.c.id.label("chain_id"),
            ancestry.c.history_length,
            messages.c.role,
            messages.c.content,
            messages.c.metadata,
        )
        .select_from(
            ancestry.outerjoin(
                messages,
                sa.and_(messages.c.turn_id == ancestry.c.id, messages.c.committed.is_(True)),
            )
        )
        .order_by(ancestry.c.depth.desc(), messages.c.round, messages.c.position)
    )


#: Built once (the recursive CTE is costly to construct); the turn id is a bound parameter.
_CONVERSATION = _conversation_statement()


# PostgreSQL forms of the conversation walk, shared by the whole-snapshot reads
# (stores/snapshots.py). Each ancestor's messages, and each step up the ancestry, are read
# LATERAL (OFFSET 0 keeps the planner from flattening them back into joins): an index probe
# of pk_messages / pk_turns per ancestor, whatever the statistics say. A plain join let the
# planner, which guesses a recursive CTE at ~100 rows where a chain has a few, hash-join a
# sequential scan of the whole table — a cost that grows with every turn ever stored. SQLite
# (nested loops only) probes the primary keys either way, and has no LATERAL.


def ancestry_cte(start: str) -> str:
    """``WITH RECURSIVE ancestry (id, parent_id, history_length, depth)``: the turns of a
    chain, from the one ``start`` selects (those three columns, depth 0) up to the root."""
    return f"""
WITH RECURSIVE ancestry AS ({ancestry_walk(start)})"""


def ancestry_walk(start: str, *, chains: bool = False) -> str:
    """The body of the ``ancestry`` walk of :func:`ancestry_cte`. With ``chains``, ``start``
    selects several turns, each with a first column ``chain`` naming the walk it starts, and
    every turn of that walk keeps it: several chains walked in one statement."""
    chain = "ancestry.chain, " if chains else ""
    return f"""
    {start}
    UNION ALL
    SELECT {chain}parent.id, parent.parent_id, parent.history_length, ancestry.depth + 1
    FROM ancestry JOIN LATERAL (
        SELECT id, parent_id, history_length FROM turns WHERE turns.id = ancestry.parent_id
        OFFSET 0
    ) AS parent ON true"""


#: The committed messages of each ancestor, as ``a`` (ancestry) joined to ``m`` (messages).
ANCESTRY_MESSAGES = """
FROM ancestry AS a
LEFT JOIN LATERAL (
    SELECT * FROM messages WHERE messages.turn_id = a.id AND messages.committed OFFSET 0
) AS m ON true"""


def conversation_json(where: str | None = None) -> str:
    """The conversation as one JSON array of ``[turn id, history_length, role, content,
    metadata]``, root first (what :func:`assemble_conversation` reads), of the ``ancestry``
    rows for which ``where`` holds (all of them when not given)."""
    condition = f"\n    WHERE {where}" if where else ""
    return f"""(
    SELECT json_agg(json_build_array(a.id, a.history_length, m.role, m.content, m.metadata)
                    ORDER BY a.depth DESC, m.round, m.position)
    {ANCESTRY_MESSAGES}{condition})"""


#: :func:`conversation_json` of the one chain an ``ancestry`` walk holds.
CONVERSATION_JSON = conversation_json()

_CONVERSATION_PG = sa.text(
    ancestry_cte("SELECT id, parent_id, history_length, 0 AS depth FROM turns WHERE id = :turn_id")
    + f"""
SELECT a.id AS chain_id, a.history_length, m.role, m.content, m.metadata
{ANCESTRY_MESSAGES}
ORDER BY a.depth DESC, m.round, m.position
"""
).columns(
    sa.column("chain_id", sa.Text),
    sa.column("history_length", sa.Integer),
    messages.c.role,
    messages.c.content,
    messages.c.metadata,
)
