"""Reads of the operator views (``open_approvals``, ``stuck_turns``, ``turn_timeline``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from stores import json_codec
from stores.database import utc

__all__ = [
    "OpenApproval",
    "StuckTurn",
    "TimelineEntry",
    "open_approvals",
    "stuck_turns",
    "timeline",
]


class OpenApproval(BaseModel):
    """One unanswered interrupt of a session's latest turn."""

    turn_id: str
    session_id: str
    agent: str
    interrupt: str
    ref: str
    input: Any
    metadata: Any
    deadline: datetime | None
    created_at: datetime
    age_seconds: float


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


class TimelineEntry(BaseModel):
    """One thing that happened to a turn."""

    at: datetime
    kind: str
    detail: str


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


def open_approvals(connection: Connection, agent: str | None = None) -> list[OpenApproval]:
    """Open approvals, oldest first (optionally of one agent)."""
    sql = "SELECT * FROM open_approvals"
    if agent is not None:
        sql += " WHERE agent = :agent"
    rows = _rows(connection, sql + " ORDER BY created_at", agent=agent)
    for row in rows:
        for key in ("created_at", "deadline"):
            row[key] = _parse_time(row[key])
        for key in ("input", "metadata"):
            if isinstance(row[key], str):
                row[key] = json_codec.loads(row[key])
    return [OpenApproval.model_validate(r) for r in rows]


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
