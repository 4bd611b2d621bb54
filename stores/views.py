"""The operator views ``open_approvals``, ``stuck_turns`` and ``turn_timeline``: their
definitions, as a database migrated to head holds them, and the reads of the last two.

Open approvals are read from ``approval_queue`` by :mod:`stores.approvals` (the inbox's
read, :class:`engine.store.PendingApproval`); the ``open_approvals`` view shows the same rows
to an operator in SQL.

Migration 0001 created the views and 0003 replaced ``open_approvals``; each keeps its own copy,
because a migration is history, so changing a view means a new migration and an edit here. As
with :mod:`stores.triggers`, they are Python strings like every other statement in ``stores/``,
and ``tests/integration/test_database_objects.py`` checks that a migrated database holds exactly
these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from engine.store import TimelineEntry
from stores.database import utc

__all__ = [
    "StuckTurn",
    "definitions",
    "stuck_turns",
    "timeline",
]


class _Clock(NamedTuple):
    """The clock arithmetic of one database, which each spells its own way."""

    now: str
    minute_ago: str
    #: The seconds since a timestamp column, ``{}`` standing for the column.
    age: str


_CLOCKS = {
    "postgresql": _Clock(
        now="now()",
        minute_ago="now() - interval '1 minute'",
        age="EXTRACT(EPOCH FROM now() - {})",
    ),
    # SQLite keeps timestamps as UTC text (docs/schema.md): its clock is text of the same shape.
    "sqlite": _Clock(
        now="strftime('%Y-%m-%d %H:%M:%f', 'now')",
        minute_ago="strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 minute')",
        age="(julianday('now') - julianday({})) * 86400.0",
    ),
}


def definitions(dialect: str) -> dict[str, str]:
    """The ``CREATE VIEW`` statement of each operator view on ``dialect`` (SQLAlchemy's name for
    the database: ``"postgresql"`` or ``"sqlite"``), by name."""
    if dialect not in _CLOCKS:
        raise ValueError(f"no operator views for the dialect {dialect!r}")
    clock = _CLOCKS[dialect]
    return {
        # One row per open approval (decided or not, until its resume answers it): a projection
        # of approval_queue, which its triggers keep exact (stores/triggers.py).
        "open_approvals": f"""
CREATE VIEW open_approvals AS
SELECT q.turn_id, q.session_id, q.agent, q.name AS interrupt, q.ref, q.input,
       q.interrupt AS metadata, q.deadline, q.created_at,
       {clock.age.format("q.created_at")} AS age_seconds
FROM approval_queue q""",
        # Running turns that need a look: lease expired, retrying, stopping, or unclaimed.
        "stuck_turns": f"""
CREATE VIEW stuck_turns AS
SELECT id AS turn_id, session_id, agent, status, attempts, max_attempts,
       lease_owner, lease_expires_at, run_after, error, created_at, updated_at,
       CASE
         WHEN lease_owner IS NOT NULL AND lease_expires_at < {clock.now}
           THEN 'lease expired'
         WHEN status = 'aborting' THEN 'aborting'
         WHEN attempts > 1 THEN 'retrying'
         ELSE 'waiting for a worker'
       END AS reason
FROM turns
WHERE status IN ('pending', 'aborting')
  AND ((lease_owner IS NOT NULL AND lease_expires_at < {clock.now})
       OR status = 'aborting'
       OR attempts > 1
       OR (lease_owner IS NULL AND run_after < {clock.minute_ago}))""",
        # Everything that happened to a turn, in order: its append-only history alone.
        "turn_timeline": """
CREATE VIEW turn_timeline AS
SELECT turn_id, id AS seq, at, kind, attempt, actor,
       CASE WHEN kind = 'status'
         THEN COALESCE(CAST(from_status AS TEXT), 'new') || ' -> ' || CAST(to_status AS TEXT)
              || COALESCE(' (' || note || ')', '')
         ELSE COALESCE(note, '')
       END AS detail,
       detail AS data
FROM turn_events""",
    }


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
        connection,
        "SELECT seq, at, kind, detail, attempt, actor FROM turn_timeline WHERE turn_id = :t",
        t=turn_id,
    )
    for row in rows:
        row["at"] = _parse_time(row["at"])
    # Entries of one moment keep the order they were appended in.
    rows.sort(key=lambda r: (r["at"], r["seq"]))
    return [TimelineEntry.model_validate(r) for r in rows]
