"""Real databases for tests: a migrated template once per run, a fresh copy per test.

PostgreSQL comes from ``DATABASE_URL`` (any database on the server; we create our own next to
it) or the local server at 127.0.0.1:5432 as user ``postgres``. SQLite templates are files.
Also what tests read of a store that no store method offers: its audit trail, its listener.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL, make_url

from engine.memory_store import InMemorySessionStore
from engine.memory_store import list_events as memory_events
from engine.store import SessionStore, TurnEvent
from stores import SqlSessionStore, migrate
from stores import turns as turn_sql

ADMIN_URL = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
_PREFIX = f"turnstile_test_{os.getpid()}"
_state: dict[str, str] = {}


def libpq_dsn(url: str | URL) -> str:
    """A plain libpq URL for an SQLAlchemy one (for a test's own psycopg connection)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _admin_dsn() -> str:
    return libpq_dsn(ADMIN_URL)


def _url_for(database: str) -> str:
    return (
        make_url(ADMIN_URL)
        .set(drivername="postgresql+psycopg", database=database)
        .render_as_string(hide_password=False)
    )


def _execute(sql: str) -> None:
    with psycopg.connect(_admin_dsn(), autocommit=True) as connection:
        connection.execute(sql)


def postgres_template() -> str:
    """The name of this run's migrated template database (created on first use)."""
    if "pg" not in _state:
        name = f"{_PREFIX}_template"
        _execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _execute(f'CREATE DATABASE "{name}"')
        migrate(_url_for(name))
        _state["pg"] = name
    return _state["pg"]


def new_postgres_database() -> str:
    """A fresh migrated database (a copy of the template); returns its URL."""
    name = f"{_PREFIX}_{uuid.uuid4().hex[:10]}"
    _execute(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template()}"')
    return _url_for(name)


def drop_postgres_database(url: str) -> None:
    """Drop a database made by :func:`new_postgres_database`."""
    _execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


def sqlite_template() -> Path:
    """This run's migrated SQLite template file."""
    if "sqlite" not in _state:
        folder = Path(tempfile.mkdtemp(prefix="turnstile-test-"))
        path = folder / "template.db"
        migrate(f"sqlite:///{path}")
        _state["sqlite"] = str(path)
    return Path(_state["sqlite"])


def new_sqlite_database() -> str:
    """A fresh migrated SQLite file; returns its URL."""
    template = sqlite_template()
    path = template.parent / f"{uuid.uuid4().hex[:10]}.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@contextmanager
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for the duration of the block."""
    url = new_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


@asynccontextmanager
async def sql_store(kind: str) -> AsyncIterator[SqlSessionStore]:
    """A SqlSessionStore on a fresh ``postgres`` or ``sqlite`` database."""
    url = new_postgres_database() if kind == "postgres" else new_sqlite_database()
    store = SqlSessionStore(url)
    try:
        yield store
    finally:
        await store.close()
        if kind == "postgres":
            drop_postgres_database(url)


async def events_of(store: SessionStore, turn_id: str) -> list[TurnEvent]:
    """The turn's status transitions, oldest first, read where ``store`` keeps them (the
    engine writes this audit trail but never reads it back, so the protocol has no method)."""
    if isinstance(store, SqlSessionStore):
        db = store.db

        def read() -> list[TurnEvent]:
            with db.autocommit() as connection:
                return turn_sql.list_events(connection, turn_id)

        return await db.run(read)
    assert isinstance(store, InMemorySessionStore)
    return memory_events(store, turn_id)


async def listen_ready(store: SqlSessionStore, timeout: float = 5.0) -> bool:
    """Wait (up to ``timeout``) until ``store`` has LISTEN active, so no notification sent
    from now on is missed; whether it has (never on SQLite, which polls)."""
    listener = store._listener
    if listener is None:
        return False
    await listener.wait_connected(timeout)
    return listener.connected.is_set()


def cleanup() -> None:
    """Drop this run's templates."""
    if "pg" in _state:
        _execute(f'DROP DATABASE IF EXISTS "{_state.pop("pg")}" WITH (FORCE)')
    if "sqlite" in _state:
        shutil.rmtree(Path(_state.pop("sqlite")).parent, ignore_errors=True)
