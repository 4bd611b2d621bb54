"""SQL for the ``sessions`` aggregate."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store import SessionRecord
from stores.database import upsert, utc
from stores.schema import sessions

__all__ = ["get_session", "lock_or_create_session"]


def _record(row: sa.Row[tuple[object, ...]]) -> SessionRecord:
    m = row._mapping
    return SessionRecord(
        id=m["id"],
        agent=m["agent"],
        owner=m["owner"],
        created_at=utc(m["created_at"]),
        updated_at=utc(m["updated_at"]),
    )


def get_session(connection: Connection, session_id: str) -> SessionRecord | None:
    """The session, or ``None``."""
    row = connection.execute(sa.select(sessions).where(sessions.c.id == session_id)).first()
    return _record(row) if row else None


def lock_or_create_session(
    connection: Connection, session_id: str, agent: str, owner: str | None, now: datetime
) -> SessionRecord:
    """Create the session if new, then lock its row for the rest of the transaction.

    The row lock serialises turn creation per session (the "one running turn" check and the
    ``seq`` numbering), so two concurrent sends cannot both pass the check.
    """
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        connection.execute(
            insert(sessions)
            .values(id=session_id, agent=agent, owner=owner, created_at=now, updated_at=now)
            .on_conflict_do_nothing(index_elements=["id"])
        )
    else:
        exists = connection.execute(
            sa.select(sessions.c.id).where(sessions.c.id == session_id)
        ).first()
        if exists is None:
            upsert(
                connection,
                sessions,
                [
                    {
                        "id": session_id,
                        "agent": agent,
                        "owner": owner,
                        "created_at": now,
                        "updated_at": now,
                    },
                ],
                ["id"],
            )
    row = connection.execute(
        sa.select(sessions).where(sessions.c.id == session_id).with_for_update()
    ).one()
    return _record(row)


def touch_session(connection: Connection, session_id: str, now: datetime) -> None:
    """Record activity on the session."""
    connection.execute(
        sa.update(sessions).where(sessions.c.id == session_id).values(updated_at=now)
    )
