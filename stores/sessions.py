"""SQL for the ``sessions`` aggregate."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store import SessionRecord
from stores.database import record_from_row, upsert_statement
from stores.schema import sessions

__all__ = ["get_session", "lock_or_create_session"]


def _record(row: sa.Row[tuple[object, ...]]) -> SessionRecord:
    return record_from_row(SessionRecord, row)


def get_session(connection: Connection, session_id: str) -> SessionRecord | None:
    """The session, or ``None``."""
    row = connection.execute(sa.select(sessions).where(sessions.c.id == session_id)).first()
    return _record(row) if row else None


def lock_or_create_session(
    connection: Connection, session_id: str, agent: str, owner: str | None, now: datetime
) -> str:
    """Create the session if new, else record activity on it; return its agent.

    One statement: ``INSERT … ON CONFLICT DO UPDATE`` both creates the row and, for an
    existing session, takes its row lock (as ``FOR UPDATE`` would) and sets ``updated_at``.
    The lock serialises turn creation per session (the "one running turn" check and the
    ``seq`` numbering) until this transaction ends, so two concurrent sends cannot both pass
    the check. A refused turn rolls the whole transaction back, ``updated_at`` included.
    """
    return str(
        connection.execute(
            _LOCK_OR_CREATE,
            {
                "id": session_id,
                "agent": agent,
                "owner": owner,
                "created_at": now,
                "updated_at": now,
            },
        ).scalar_one()
    )


#: Built once (a text statement: SQLAlchemy cannot cache its ON CONFLICT constructs).
_LOCK_OR_CREATE = upsert_statement(sessions, ["id"], update=["updated_at"], returning="agent")
