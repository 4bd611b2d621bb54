"""SQL for the inbox UI's browser sessions (``ui_sessions``) and sign-in counters
(``ui_login_failures``); see :mod:`engine.remote.ui.browser_sessions` for what they mean."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from engine.remote.ui.browser_sessions import (
    ENDED_SESSIONS_KEPT,
    LOGIN_COUNTS_KEPT,
    BrowserSessionRecord,
    LoginCount,
    check_revoke_target,
)
from stores.database import Database, utc
from stores.schema import ui_login_failures, ui_sessions

__all__ = [
    "SqlBrowserSessions",
    "count_login_attempt",
    "create_session",
    "forgive_login_attempt",
    "get_session",
    "list_sessions",
    "revoke_sessions",
    "touch_session",
]

#: Most rows ``list_sessions`` returns (an operator's listing, not an export).
MAX_LISTED = 1000


def _record(row: sa.Row[tuple[object, ...]]) -> BrowserSessionRecord:
    m = row._mapping
    return BrowserSessionRecord(
        id=m["id"],
        principal=m["principal"],
        roles=tuple(m["roles"] or ()),
        csrf=m["csrf"],
        created_at=utc(m["created_at"]),
        last_seen_at=utc(m["last_seen_at"]),
        expires_at=utc(m["expires_at"]),
        revoked_at=utc(m["revoked_at"]),
        user_agent=m["user_agent"],
        client_address=m["client_address"],
    )


def create_session(connection: Connection, session: BrowserSessionRecord) -> None:
    """Insert a new session row; delete sessions long expired and sign-in counters long
    idle (the first reads ``ix_ui_sessions_expires_at``; the second a small table)."""
    connection.execute(
        sa.delete(ui_sessions).where(
            ui_sessions.c.expires_at < session.created_at - ENDED_SESSIONS_KEPT
        )
    )
    connection.execute(
        sa.delete(ui_login_failures).where(
            ui_login_failures.c.window_started_at < session.created_at - LOGIN_COUNTS_KEPT
        )
    )
    connection.execute(
        sa.insert(ui_sessions).values(
            id=session.id,
            principal=session.principal,
            roles=list(session.roles),
            csrf=session.csrf,
            created_at=session.created_at,
            last_seen_at=session.last_seen_at,
            expires_at=session.expires_at,
            revoked_at=session.revoked_at,
            user_agent=session.user_agent,
            client_address=session.client_address,
        )
    )


def get_session(connection: Connection, session_id: str) -> BrowserSessionRecord | None:
    """The session row, or ``None``."""
    row = connection.execute(sa.select(ui_sessions).where(ui_sessions.c.id == session_id)).first()
    return _record(row) if row else None


def touch_session(connection: Connection, session_id: str, now: datetime) -> bool:
    """``last_seen_at = now`` on a session neither revoked nor expired; whether it moved."""
    moved = connection.execute(
        sa.update(ui_sessions)
        .where(
            ui_sessions.c.id == session_id,
            ui_sessions.c.revoked_at.is_(None),
            ui_sessions.c.expires_at > now,
        )
        .values(last_seen_at=now)
    )
    return moved.rowcount == 1


def revoke_sessions(
    connection: Connection, now: datetime, session_id: str | None, principal: str | None
) -> list[str]:
    """Revoke one session or every session of a principal (those not revoked yet); the
    ids revoked."""
    check_revoke_target(session_id, principal)
    target = (
        ui_sessions.c.id == session_id
        if session_id is not None
        else ui_sessions.c.principal == principal
    )
    rows = connection.execute(
        sa.update(ui_sessions)
        .where(target, ui_sessions.c.revoked_at.is_(None))
        .values(revoked_at=now)
        .returning(ui_sessions.c.id)
    )
    return sorted(str(row[0]) for row in rows)


def list_sessions(
    connection: Connection,
    now: datetime,
    principal: str | None,
    include_ended_after: datetime | None,
) -> list[BrowserSessionRecord]:
    """Live sessions (and those that ended after ``include_ended_after``), newest first."""
    live = sa.and_(ui_sessions.c.revoked_at.is_(None), ui_sessions.c.expires_at > now)
    shown: sa.ColumnElement[bool] = live
    if include_ended_after is not None:
        shown = sa.or_(
            live,
            ui_sessions.c.revoked_at > include_ended_after,
            sa.and_(
                ui_sessions.c.revoked_at.is_(None),
                ui_sessions.c.expires_at > include_ended_after,
            ),
        )
    query = sa.select(ui_sessions).where(shown)
    if principal is not None:
        query = query.where(ui_sessions.c.principal == principal)
    query = query.order_by(ui_sessions.c.created_at.desc(), ui_sessions.c.id.desc())
    return [_record(row) for row in connection.execute(query.limit(MAX_LISTED))]


def count_login_attempt(
    connection: Connection, keys: Sequence[str], now: datetime, window: timedelta
) -> list[LoginCount]:
    """Count one attempt against each key: one ``INSERT … ON CONFLICT DO UPDATE`` per key,
    which starts a new window when the key's has ended (keys in sorted order, so two
    processes counting the same keys cannot deadlock)."""
    table = ui_login_failures
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    ended = table.c.window_started_at <= now - window
    counted = []
    for key in sorted(set(keys)):
        inserted = insert(table).values(key=key, failures=1, window_started_at=now)
        statement = inserted.on_conflict_do_update(
            index_elements=[table.c.key],
            set_={
                "failures": sa.case((ended, 1), else_=table.c.failures + 1),
                "window_started_at": sa.case((ended, now), else_=table.c.window_started_at),
            },
        ).returning(table.c.failures, table.c.window_started_at)
        row = connection.execute(statement).one()
        counted.append(LoginCount(key=key, failures=row[0], window_started_at=utc(row[1])))
    return counted


def forgive_login_attempt(
    connection: Connection, give_back: Sequence[str], clear: Sequence[str]
) -> None:
    """Take a successful attempt back from ``give_back``; delete the ``clear`` counters."""
    table = ui_login_failures
    if give_back:
        connection.execute(
            sa.update(table)
            .where(table.c.key.in_(sorted(set(give_back))), table.c.failures > 0)
            .values(failures=table.c.failures - 1)
        )
    if clear:
        connection.execute(sa.delete(table).where(table.c.key.in_(sorted(set(clear)))))


class SqlBrowserSessions:
    """The inbox UI's browser sessions and sign-in counts in a PostgreSQL or SQLite database
    (a :class:`~engine.remote.ui.browser_sessions.BrowserSessionStore`): what ``turnstile
    serve`` hands the web UI, on the database of the agents it serves, so every server
    process shares the sessions and the sign-in limits."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_browser_session(self, session: BrowserSessionRecord) -> None:
        """Record a new signed-in session."""
        await self.db.write(lambda c: create_session(c, session))

    async def get_browser_session(self, session_id: str) -> BrowserSessionRecord | None:
        """The session with that id (live or ended), or ``None``."""
        return await self.db.read(lambda c: get_session(c, session_id))

    async def touch_browser_session(self, session_id: str, *, now: datetime) -> bool:
        """Record a request on a live session; whether it was live."""
        return await self.db.write(lambda c: touch_session(c, session_id, now))

    async def revoke_browser_sessions(
        self,
        *,
        now: datetime,
        session_id: str | None = None,
        principal: str | None = None,
    ) -> list[str]:
        """End one session, or every live session of a principal; the ids ended."""
        return await self.db.write(lambda c: revoke_sessions(c, now, session_id, principal))

    async def list_browser_sessions(
        self, *, principal: str | None = None, include_ended_after: datetime | None = None
    ) -> list[BrowserSessionRecord]:
        """The live sessions (of one principal), and those ended after the given moment."""
        return await self.db.read(
            lambda c: list_sessions(c, datetime.now(UTC), principal, include_ended_after)
        )

    async def count_login_attempt(
        self, keys: Sequence[str], *, now: datetime, window: timedelta
    ) -> list[LoginCount]:
        """Count one sign-in attempt under each key, within ``window``; the counts."""
        return await self.db.write(lambda c: count_login_attempt(c, keys, now, window))

    async def forgive_login_attempt(
        self, *, give_back: Sequence[str], clear: Sequence[str]
    ) -> None:
        """Give back the attempt counted under ``give_back``; clear the counts of ``clear``."""
        await self.db.write(lambda c: forgive_login_attempt(c, give_back, clear))
