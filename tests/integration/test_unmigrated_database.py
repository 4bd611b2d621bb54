"""A client on a database that was never migrated gets an error that says so and names the
command that fixes it — on the statement that first touches the schema, on both databases."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from engine import Engine, ScriptedModel
from engine.errors import StoreError
from stores import SchemaNotAtHeadError, SqlSessionStore, migrate
from stores.schema_check import names_missing_schema
from tests.conftest import TEST_STATE_KEYS
from tests.databases import ADMIN_URL, libpq_dsn


@contextlib.contextmanager
def empty_database(backend: str) -> Iterator[str]:
    """A database with no tables at all; its URL."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{Path(folder) / 'empty.db'}"
        return
    name = f"turnstile_unmigrated_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq_dsn(ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq_dsn(ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_a_send_on_an_unmigrated_database_names_turnstile_migrate(backend: str) -> None:
    """The first statement — creating the turn (PostgreSQL's one-statement path, SQLite's
    transaction) — and a plain read both raise :class:`SchemaNotAtHeadError`; once migrated,
    the same store works."""
    with empty_database(backend) as url:
        store = SqlSessionStore(url)
        try:
            ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
            agent = ai.define_agent(name="a", store=store, execution="inline")
            with pytest.raises(SchemaNotAtHeadError) as refused:
                await agent.chat().send("hello")
            message = str(refused.value)
            assert "empty (never migrated)" in message
            assert "turnstile migrate --db" in message
            assert isinstance(refused.value, StoreError)  # callers catching StoreError still do
            with pytest.raises(SchemaNotAtHeadError):
                await agent.get_snapshot(session_id="nobody")

            migrate(url)
            response = await agent.chat().send("hello")
            assert response.text == "Echo: hello"
        finally:
            await store.close()


def test_only_missing_schema_objects_trigger_the_check() -> None:
    """Undefined table/column/type/function errors do (PostgreSQL by SQLSTATE, SQLite by its
    words); others, such as a syntax error, do not."""
    assert names_missing_schema(psycopg.errors.UndefinedTable("relation does not exist"))
    assert names_missing_schema(psycopg.errors.UndefinedColumn("column does not exist"))
    assert not names_missing_schema(psycopg.errors.SyntaxError("syntax error"))
    assert names_missing_schema(sqlite3.OperationalError("no such table: turns"))
    assert not names_missing_schema(sqlite3.OperationalError("database is locked"))
