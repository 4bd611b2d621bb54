"""Appending to a turn's history (``turn_events``) from inside a writer's transaction.

The history is append-only (a trigger refuses any UPDATE of it): every change of a turn adds
its entries in the transaction that makes it. Status transitions are written by
:mod:`stores.turns` and :mod:`stores.fenced` with the transition, tool calls by the triggers
of :mod:`stores.triggers`, PostgreSQL's claims by the claim statement
(:mod:`stores.turn_claims`); everything else (SQLite's claims, decisions, votes, assignment
changes, and whatever else a caller records, e.g. a webhook delivery) goes through
:func:`append_history`, which adds no statement of its own beyond the one INSERT.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store.history import HistoryEntry
from stores.schema import JSON, TIMESTAMP, turn_events, turns

__all__ = ["append_history"]


def append_history(connection: Connection, turn_id: str, entry: HistoryEntry) -> None:
    """Append ``entry`` to the history of turn ``turn_id``, in ``connection``'s open
    transaction (it commits or rolls back with the change it records), stamped with the
    turn's status and (unless the entry names one) its current attempt. Nothing is written
    for an unknown turn."""
    values: dict[str, Any] = {
        "turn_id": turn_id,
        "kind": entry.kind,
        "attempt": entry.attempt,
        "actor": entry.actor,
        "note": entry.note,
        "detail": entry.detail,
        "at": entry.at,
    }
    connection.execute(_APPEND, values)


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
