"""SQL for moving turns between application versions (``turnstile turns migrate``).

The turns a version still owes work to are its *waiting* turns: paused ones (completed at
interrupts, their session's latest turn) and queued ones (pending, no live lease). Moving one
re-pins it — a new ``app_version`` and ``definition_fingerprint`` — with one guarded UPDATE
that re-checks it is still waiting under the old version, and records the move as a
``turn_events`` row (status unchanged, a note naming both versions), in one transaction that
also keeps each target definition in ``agent_definitions`` (once per fingerprint).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.status import TurnStatus
from engine.store import TurnRecord
from stores.definitions import save_definition
from stores.notify import WORK_CHANNEL, notify
from stores.schema import TIMESTAMP, turn_events, turns
from stores.turns import paused_now, record

__all__ = ["VersionMove", "list_waiting", "move_waiting"]


def _queued(now: datetime | sa.BindParameter[datetime]) -> sa.ColumnElement[bool]:
    """Pending with no live lease."""
    return sa.and_(
        turns.c.status == TurnStatus.PENDING.value,
        sa.or_(turns.c.lease_expires_at.is_(None), turns.c.lease_expires_at < now),
    )


def _waiting(now: datetime | sa.BindParameter[datetime]) -> sa.ColumnElement[bool]:
    """Paused and the session's latest turn, or pending with no live lease."""
    return sa.or_(paused_now(), _queued(now))


def list_waiting(
    connection: Connection,
    *,
    version: str,
    agents: Collection[str] | None,
    now: datetime,
    limit: int,
) -> list[TurnRecord]:
    """The waiting turns pinned to ``version`` (of ``agents`` when given), oldest first."""
    filters = [turns.c.app_version == version]
    if agents is not None:
        filters.append(turns.c.agent.in_(list(agents)))
    # The paused and the queued ones each read on their own (approval_queue, the pending
    # turns), then merged: one scan for either would filter through every turn ever paused.
    pages = [
        sa.select(turns.c.id)
        .where(condition, *filters)
        .order_by(turns.c.created_at, turns.c.id)
        .limit(limit)
        .subquery()
        for condition in (paused_now(), _queued(now))
    ]
    query = (
        sa.select(turns)
        .where(turns.c.id.in_(sa.union_all(*(sa.select(page.c.id) for page in pages))))
        .order_by(turns.c.created_at, turns.c.id)
        .limit(limit)
    )
    return [record(row) for row in connection.execute(query)]


@dataclass(frozen=True)
class VersionMove:
    """Where one agent's turns go: the new version and the definition they are pinned to."""

    to_version: str
    fingerprint: str
    definition: Mapping[str, Any]


_MOVE = (
    sa.update(turns)
    .where(
        turns.c.id == sa.bindparam("turn_id"),
        turns.c.app_version == sa.bindparam("from_version"),
        _waiting(sa.bindparam("now", type_=TIMESTAMP)),
    )
    .values(
        app_version=sa.bindparam("to_version"),
        definition_fingerprint=sa.bindparam("fingerprint"),
        updated_at=sa.bindparam("now", type_=TIMESTAMP),
    )
    .returning(turns.c.status, turns.c.attempts)
)


def move_waiting(
    connection: Connection,
    turns_to_move: Sequence[TurnRecord],
    *,
    from_version: str,
    moves: Mapping[str, VersionMove],
    note: str,
    now: datetime,
) -> list[str]:
    """Re-pin each turn (still waiting under ``from_version``) by its agent's entry in
    ``moves``, in the caller's transaction; the ids moved (a turn that was resumed, claimed
    or moved meanwhile is left as it is)."""
    for agent, target in moves.items():
        save_definition(
            connection,
            fingerprint=target.fingerprint,
            agent=agent,
            definition=target.definition,
            now=now,
        )
    moved: list[str] = []
    for turn in turns_to_move:
        move = moves.get(turn.agent)
        if move is None:
            continue
        row = connection.execute(
            _MOVE,
            {
                "turn_id": turn.id,
                "from_version": from_version,
                "to_version": move.to_version,
                "fingerprint": move.fingerprint,
                "now": now,
            },
        ).first()
        if row is None:
            continue
        connection.execute(
            sa.insert(turn_events).values(
                turn_id=turn.id,
                from_status=row.status,
                to_status=row.status,
                attempt=row.attempts,
                note=note,
                at=now,
            )
        )
        if row.status == TurnStatus.PENDING.value:
            # The new version's workers claim it now, not at their next poll.
            notify(connection, WORK_CHANNEL, turn.id)
        moved.append(turn.id)
    return moved
