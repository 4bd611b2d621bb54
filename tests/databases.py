"""Real databases for tests: a migrated template once per run, a fresh copy per test.

PostgreSQL comes from ``DATABASE_URL`` (any database on the server; we create our own next to
it) or the local server at 127.0.0.1:5432 as user ``postgres``. SQLite templates are files.
Also what tests read of a store that no store method offers: its audit trail, its listener;
and which tests use PostgreSQL (:func:`uses_postgres`, for the ``postgres`` marker).
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import CodeType

import psycopg
import pytest
from sqlalchemy.engine import URL, make_url

from engine.store import SessionStore, TurnEvent
from engine.store.memory import InMemorySessionStore
from engine.store.memory import list_events as memory_events
from stores import SqlSessionStore, migrate
from stores import turns as turn_sql
from stores.postgres import PostgresSessionStore

ADMIN_URL = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
_PREFIX = f"turnstile_test_{os.getpid()}"
_state: dict[str, str] = {}

#: The test running now (set by tests/conftest.py): a test not marked ``postgres`` may not
#: open a database, so ``-m "not postgres"`` surely runs without a server.
running_test: pytest.Item | None = None

#: What code names to reach the server, besides the kind ``"postgres"`` it passes to
#: :func:`sql_store`, ``serve_banking`` or a store factory.
_OPENERS = frozenset({"ADMIN_URL", "postgres_url", "new_postgres_database"})
#: Parameter values that choose a backend other than PostgreSQL (see :func:`uses_postgres`).
_OTHER_BACKENDS = ("memory", "sqlite", "openai", "anthropic", "remote-memory")


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
    test = running_test
    if test is not None and test.get_closest_marker("postgres") is None:
        raise AssertionError(
            f"{test.nodeid} opens a PostgreSQL database but is not marked postgres: give it a "
            '"postgres" parameter, call postgres_url()/sql_store("postgres") in the test or one '
            "of its fixtures (see uses_postgres), or mark it @pytest.mark.postgres"
        )
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
    if not isinstance(store, PostgresSessionStore):
        return False
    await store._listener.wait_connected(timeout)
    return store._listener.connected.is_set()


def cleanup() -> None:
    """Drop this run's templates."""
    if "pg" in _state:
        _execute(f'DROP DATABASE IF EXISTS "{_state.pop("pg")}" WITH (FORCE)')
    if "sqlite" in _state:
        shutil.rmtree(Path(_state.pop("sqlite")).parent, ignore_errors=True)


def uses_postgres(item: pytest.Item) -> bool:
    """Whether ``item`` opens a PostgreSQL database, read from how it is collected.

    A test parametrised over backends uses PostgreSQL when one of its parameters names it
    ("postgres", "postgres-queued", "remote-postgres"); one whose parameters name another
    backend ("memory", "sqlite", ...) does not. Otherwise it does when its function or one of
    its fixtures (their code, nested functions included) calls :func:`postgres_url` or
    :func:`new_postgres_database`, connects to :data:`ADMIN_URL`, or passes the kind
    ``"postgres"``. As :func:`new_postgres_database` refuses any test this misses, the
    ``postgres`` marker is complete for the tests that run.
    """
    if not isinstance(item, pytest.Function):
        return False
    callspec = getattr(item, "callspec", None)
    chosen = [v for v in callspec.params.values() if isinstance(v, str)] if callspec else []
    if any("postgres" in value for value in chosen):
        return True
    if any(v == other or v.startswith(f"{other}-") for v in chosen for other in _OTHER_BACKENDS):
        return False
    fixtures = item._fixtureinfo.name2fixturedefs.values()
    functions = [item.function, *(definitions[-1].func for definitions in fixtures)]
    return any(_names_postgres(inspect.unwrap(function)) for function in functions)


def _names_postgres(function: object) -> bool:
    code = getattr(function, "__code__", None)
    return isinstance(code, CodeType) and _code_names_postgres(code)


def _code_names_postgres(code: CodeType) -> bool:
    if _OPENERS & set(code.co_names) or "postgres" in code.co_consts:
        return True
    nested = (const for const in code.co_consts if isinstance(const, CodeType))
    return any(_code_names_postgres(const) for const in nested)
