"""Reads of the operator views ``stuck_turns`` and ``turn_timeline``.

Open approvals are read from ``approval_queue`` by :mod:`stores.approvals` (the inbox's
read, :class:`engine.store.PendingApproval`); the ``open_approvals`` view shows the same rows
to an operator in SQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from engine.store import TimelineEntry
from stores.database import utc

__all__ = [
    "StuckTurn",
    "stuck_turns",
    "timeline",
]


class StuckTurn(BaseModel):
    """A running turn that needs a look, and why."""

    turn_id: str
    session_id: str
    agent: str
    status: str
    attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    reason: str


def _rows(connection: Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
    result = connection.execute(sa.text(sql), params)
    return [
        {k: utc(v) if isinstance(v, datetime) else v for k, v in row._mapping.items()}
        for row in result
    ]


def _parse_time(value: Any) -> Any:
    # SQLite views return timestamps as text.
    if isinstance(value, str):
        return utc(datetime.fromisoformat(value))
    return value


def stuck_turns(connection: Connection) -> list[StuckTurn]:
    """Running turns whose lease expired, that are retrying, aborting or unclaimed."""
    rows = _rows(connection, "SELECT * FROM stuck_turns ORDER BY updated_at")
    for row in rows:
        row["lease_expires_at"] = _parse_time(row["lease_expires_at"])
    return [StuckTurn.model_validate(r) for r in rows]


def timeline(connection: Connection, turn_id: str) -> list[TimelineEntry]:
    """Everything that happened to one turn, in order."""
    rows = _rows(
        connection, "SELECT at, kind, detail FROM turn_timeline WHERE turn_id = :t", t=turn_id
    )
    for row in rows:
        row["at"] = _parse_time(row["at"])
    return sorted((TimelineEntry.model_validate(r) for r in rows), key=lambda e: e.at)
