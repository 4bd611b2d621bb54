"""SQL for the conversation: ``messages``, saved per round of a turn."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.parts import Message
from engine.store import RoundRecord
from stores.schema import messages, turns

__all__ = ["conversation", "load_rounds", "save_round"]


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
                    "turn_id": turn_id,
                    "round": round_.round,
                    "position": position,
                    "role": message.role,
                    "content": [p.to_wire() for p in message.content],
                    "metadata": message.metadata,
                    "committed": round_.committed,
                    "created_at": now,
                }
                for position, message in enumerate(round_.messages)
            ],
        )


def _message(row: sa.Row[tuple[object, ...]]) -> Message:
    m = row._mapping
    wire: dict[str, object] = {"role": m["role"], "content": m["content"]}
    if m["metadata"] is not None:
        wire["metadata"] = m["metadata"]
    return Message.model_validate(wire)


def load_rounds(connection: Connection, turn_id: str) -> list[RoundRecord]:
    """Every round of the turn, committed or not, in order."""
    rows = connection.execute(_ROUNDS, {"turn_id": turn_id}).all()
    grouped: dict[int, list[sa.Row[tuple[object, ...]]]] = defaultdict(list)
    for row in rows:
        grouped[row._mapping["round"]].append(row)
    return [
        RoundRecord(
            round=number,
            messages=[_message(r) for r in group],
            committed=bool(group[0]._mapping["committed"]),
        )
        for number, group in sorted(grouped.items())
    ]


def conversation(connection: Connection, chain: Sequence[tuple[str, int]]) -> list[Message]:
    """Assemble a conversation from a root-first chain of ``(turn id, history_length)``.

    One query loads the committed messages of every turn of the chain; each turn keeps the
    first ``history_length`` messages of its parent's conversation, then adds its own.
    """
    ids = [turn_id for turn_id, _ in chain]
    rows = connection.execute(_COMMITTED, {"ids": ids}).all()
    own: dict[str, list[Message]] = defaultdict(list)
    for row in rows:
        own[row._mapping["turn_id"]].append(_message(row))
    result: list[Message] = []
    for turn_id, history_length in chain:
        result = result[:history_length] + own[turn_id]
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
_COMMITTED = (
    sa.select(messages)
    .where(
        messages.c.turn_id.in_(sa.bindparam("ids", expanding=True)),
        messages.c.committed.is_(True),
    )
    .order_by(messages.c.round, messages.c.position)
)


def _chain_statement() -> sa.Select[tuple[str, int]]:
    ancestry = (
        sa.select(
            turns.c.id, turns.c.parent_id, turns.c.history_length, sa.literal(0).label("depth")
        )
        .where(turns.c.id == sa.bindparam("turn_id"))
        .cte("ancestry", recursive=True)
    )
    parent = turns.alias("parent")
    ancestry = ancestry.union_all(
        sa.select(
            parent.c.id, parent.c.parent_id, parent.c.history_length, ancestry.c.depth + 1
        ).where(parent.c.id == ancestry.c.parent_id)
    )
    return sa.select(ancestry.c.id, ancestry.c.history_length).order_by(ancestry.c.depth.desc())


#: Built once (the recursive CTE is costly to construct); the turn id is a bound parameter.
_CHAIN = _chain_statement()


def chain_of(connection: Connection, turn_id: str) -> list[tuple[str, int]]:
    """The turn and its ancestors, root first, as ``(id, history_length)``."""
    rows = connection.execute(_CHAIN, {"turn_id": turn_id}).all()
    return [(r[0], r[1]) for r in rows]
