"""The triggers, trigger functions and views of a database migrated to head are exactly those
written in ``stores/`` (:mod:`stores.triggers`, :mod:`stores.views`), on both databases.

The migrations keep their own copies, as history; these tests are what ties the current source
to them, so a change to one without the other fails here."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from stores import triggers, views
from tests.databases import libpq_dsn, new_sqlite_database, postgres_url

#: PostgreSQL's own text of every view, trigger and function of the schema, with the statement
#: that drops it, views first (they may read a function) and functions last (triggers call them).
PG_OBJECTS = """
SELECT 1, 'view', c.relname, pg_get_viewdef(c.oid), format('DROP VIEW %I', c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'v'
UNION ALL
SELECT 2, 'trigger', t.tgname, pg_get_triggerdef(t.oid),
       format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND NOT t.tgisinternal
UNION ALL
SELECT 3, 'function', p.proname, pg_get_functiondef(p.oid),
       format('DROP FUNCTION %s', p.oid::regprocedure)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
ORDER BY 1, 3"""


def source(dialect: str) -> dict[str, str]:
    """Every statement ``stores/`` writes for ``dialect``'s triggers, functions and views."""
    return {**triggers.definitions(dialect), **views.definitions(dialect)}


def normalised(sql: str) -> str:
    """``sql`` with every run of whitespace one space, each ``--`` comment closed first so
    that a line break ending a comment still counts."""
    closed = re.sub(r"--([^\n]*)", r"/*\1*/", sql)
    return " ".join(closed.split())


def pg_definitions(connection: psycopg.Connection[Any]) -> dict[str, str]:
    """PostgreSQL's text of each view, trigger and function, by kind and name."""
    return {
        f"{kind} {name}": normalised(text)
        for _, kind, name, text, _ in connection.execute(PG_OBJECTS)
    }


def test_a_migrated_sqlite_database_holds_the_triggers_and_views_of_stores() -> None:
    """sqlite_master holds, for each trigger and view, the statement stores/ writes for it, and
    no other."""
    path = make_url(new_sqlite_database()).database
    assert path is not None
    with closing(sqlite3.connect(path)) as connection:
        held = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('trigger', 'view')"
        ).fetchall()
    assert {name: normalised(sql) for name, sql in held} == {
        name: normalised(sql) for name, sql in source("sqlite").items()
    }


def test_a_migrated_postgres_database_holds_the_triggers_functions_and_views_of_stores() -> None:
    """PostgreSQL describes the migrated views, triggers and functions exactly as it describes
    them after they are dropped and created again from the statements of stores/."""
    with postgres_url() as url, psycopg.connect(libpq_dsn(url)) as connection:
        migrated = pg_definitions(connection)
        # PostgreSQL keeps views and triggers as parse trees, not as text, so the source is
        # compared through PostgreSQL's description of what its statements create.
        for *_, drop in connection.execute(PG_OBJECTS).fetchall():
            connection.execute(drop)
        for statement in source("postgresql").values():
            connection.execute(statement)
        assert pg_definitions(connection) == migrated
        connection.rollback()
