"""The common path's statements run on psycopg's async connections (stores/pg.py).

A statement built with SQLAlchemy means the same there: its literal parameters and its typed
parameters' conversions come along; a constraint's refusal is a typed error that wrote
nothing; a connection the server dropped is replaced and the statement retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import sqlalchemy as sa

from engine.errors import StoreError
from stores.pg import PgConnections, PgStatement, StatementRefused
from stores.schema import JSON
from tests.databases import libpq_dsn, postgres_url


@pytest.fixture
def dsn() -> Iterator[str]:
    with postgres_url() as url:
        yield libpq_dsn(url)


@pytest.fixture
async def pg(dsn: str) -> AsyncIterator[PgConnections]:
    connections = PgConnections(dsn, size=2)
    try:
        yield connections
    finally:
        await connections.close()


NOTES = sa.table("notes", sa.column("id", sa.Text), sa.column("body", JSON))


async def make_notes(pg: PgConnections) -> None:
    await pg.fetch(
        PgStatement(sa.text("CREATE TABLE notes (id text PRIMARY KEY, body jsonb NOT NULL)")), {}
    )


async def test_a_statement_binds_its_literals_and_typed_parameters_as_sqlalchemy_would(
    pg: PgConnections,
) -> None:
    """A JSON-typed parameter is serialised, a constant in the statement is written as a
    literal, and rows come back as dicts with JSON decoded."""
    await make_notes(pg)
    insert = PgStatement(
        sa.insert(NOTES).values(id=sa.bindparam("id"), body=sa.bindparam("body", type_=JSON))
    )
    await pg.fetch(insert, {"id": "n1", "body": {"tags": ["a", "b"], "n": 1}})
    await pg.fetch(insert, {"id": "n2", "body": {"n": 2}})

    select = PgStatement(sa.select(NOTES).where(NOTES.c.id == "n1"))  # "n1" is a literal
    assert await pg.fetch(select, {}) == [{"id": "n1", "body": {"tags": ["a", "b"], "n": 1}}]


async def test_a_constraint_refusal_is_typed_and_writes_nothing(pg: PgConnections) -> None:
    """A duplicate key raises StatementRefused (a StoreError); the row is unchanged and the
    connection stays usable."""
    await make_notes(pg)
    insert = PgStatement(
        sa.text("INSERT INTO notes VALUES (:id, CAST(:body AS jsonb))"),
    )
    await pg.fetch(insert, {"id": "n1", "body": '{"first": true}'})

    with pytest.raises(StoreError, match="pkey") as refused:
        await pg.fetch(insert, {"id": "n1", "body": '{"first": false}'})

    assert isinstance(refused.value, StatementRefused)
    rows = await pg.fetch(PgStatement(sa.text("SELECT body FROM notes")), {})
    assert rows == [{"body": {"first": True}}]


async def test_statements_run_together_commit_together_or_not_at_all(pg: PgConnections) -> None:
    """fetch_together runs its statements in one transaction: their rows come back in order,
    and a server error in a later statement undoes the earlier ones."""
    await make_notes(pg)
    insert = PgStatement(
        sa.insert(NOTES)
        .values(id=sa.bindparam("id"), body=sa.bindparam("body", type_=JSON))
        .returning(NOTES.c.id)
    )
    txid = PgStatement(sa.text("SELECT txid_current() AS txid"))

    inserted, first, second = await pg.fetch_together(
        [(insert, {"id": "n1", "body": {}}), (txid, {}), (txid, {})]
    )
    assert inserted == [{"id": "n1"}] and first == second

    failing = PgStatement(sa.text("SELECT 1 / 0 AS never"))
    with pytest.raises(StoreError):
        await pg.fetch_together([(insert, {"id": "n2", "body": {}}), (failing, {})])
    ids = await pg.fetch(PgStatement(sa.select(NOTES.c.id)), {})
    assert ids == [{"id": "n1"}]


async def test_other_database_errors_are_store_errors(pg: PgConnections) -> None:
    """A statement the server rejects raises StoreError, not the driver's exception."""
    with pytest.raises(StoreError, match="no_such_table"):
        await pg.fetch(PgStatement(sa.text("SELECT * FROM no_such_table")), {})


async def test_a_dropped_connection_is_replaced_and_the_statement_retried(
    pg: PgConnections, dsn: str
) -> None:
    """After the server terminated the pooled connection, the next statement still runs."""
    who = PgStatement(sa.text("SELECT pg_backend_pid() AS pid"))
    (first,) = await pg.fetch(who, {})
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first["pid"],))

    (second,) = await pg.fetch(who, {})

    assert second["pid"] != first["pid"]


# A deferred constraint trigger runs at commit, i.e. when the server handles the pipeline's
# sync: after the statement's result has been sent, before the sync's reply. Terminating its
# own backend there makes the server answer the sync with a FATAL error and hang up, as a
# pg_terminate_backend from an operator can at that moment. Only the first insert does it.
_ENDED_AT_COMMIT = """
CREATE SEQUENCE commits_seen;
CREATE TABLE ledger (id integer);
CREATE FUNCTION end_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('commits_seen') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);  -- the termination interrupts this
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER end_first_commit AFTER INSERT ON ledger
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION end_first_commit();
"""


async def test_a_session_ended_while_committing_is_a_lost_connection_and_retried(
    pg: PgConnections, dsn: str
) -> None:
    """The server ending the session in place of the sync's reply is a lost connection, not
    a malformed answer: the statement runs again on a fresh session (the first attempt did
    not commit), instead of failing with an error the caller cannot classify."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(_ENDED_AT_COMMIT)
    insert = PgStatement(sa.text("INSERT INTO ledger VALUES (1) RETURNING id"))

    assert await pg.fetch(insert, {}) == [{"id": 1}]

    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM ledger").fetchone() == (1,)
        assert admin.execute("SELECT last_value FROM commits_seen").fetchone() == (2,)


async def test_at_most_size_connections_are_busy_at_once(pg: PgConnections) -> None:
    """Five concurrent statements on a pool of two share two backends: the rest wait for a
    connection instead of opening more."""
    who = PgStatement(sa.text("SELECT pg_backend_pid() AS pid, pg_sleep(0.05) AS slept"))

    results = await asyncio.gather(*(pg.fetch(who, {}) for _ in range(5)))

    assert len({rows[0]["pid"] for rows in results}) <= 2


def test_expanding_parameters_are_refused_when_compiling() -> None:
    """An IN list whose length varies has no single psycopg form: = ANY(array) is used."""
    with pytest.raises(ValueError, match="ANY"):
        PgStatement(sa.select(NOTES).where(NOTES.c.id.in_(sa.bindparam("ids", expanding=True))))


async def test_close_leaves_no_connection_open(dsn: str) -> None:
    """A statement running while the pool closes returns its connection closed, so nothing
    of the pool stays connected; a statement after the close still runs."""
    pool = PgConnections(dsn, size=2)
    slow = asyncio.create_task(
        pool.fetch(PgStatement(sa.text("SELECT pg_sleep(0.2) AS slept")), {})
    )
    await asyncio.sleep(0.05)
    await pool.close()
    await slow

    assert await pool.fetch(PgStatement(sa.text("SELECT 1 AS one")), {}) == [{"one": 1}]
    others = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with psycopg.connect(dsn, autocommit=True) as admin:
        # A closed connection's backend leaves pg_stat_activity a moment after it exits.
        async with asyncio.timeout(5):
            while True:
                if admin.execute(others).fetchone() == (0,):
                    break
                await asyncio.sleep(0.02)


async def test_a_statement_is_prepared_once_per_session_and_parameter_types(dsn: str) -> None:
    """The first run of a statement prepares it in the same round trip; later runs reuse
    that preparation, and a value of another type (an integer where text was) gets one of
    its own — as psycopg prepares."""
    pool = PgConnections(dsn, size=1)  # one session: every statement below shares it
    echo = PgStatement(sa.text("SELECT CAST(:value AS text) AS value"))
    try:
        for value in ("a", "b", "c", 7, 8):
            assert await pool.fetch(echo, {"value": value}) == [{"value": str(value)}]
        prepared = PgStatement(
            sa.text("SELECT count(*) AS n FROM pg_prepared_statements WHERE statement = :sql")
        )
        rows = await pool.fetch(prepared, {"sql": echo.wire_sql.decode()})
    finally:
        await pool.close()

    assert rows == [{"n": 2}]


async def test_a_failed_pipeline_leaves_its_session_usable(dsn: str) -> None:
    """When an earlier statement fails, the later ones of the same call never ran — not even
    their preparation — and the next call prepares and runs them on the same session."""
    pool = PgConnections(dsn, size=1)
    failing = PgStatement(sa.text("SELECT 1 / 0 AS never"))
    fresh = PgStatement(sa.text("SELECT pg_backend_pid() AS pid, 41 + 1 AS answer"))
    try:
        (before,) = await pool.fetch(PgStatement(sa.text("SELECT pg_backend_pid() AS pid")), {})
        with pytest.raises(StoreError, match="division by zero"):
            await pool.fetch_together([(failing, {}), (fresh, {})])
        (after,) = await pool.fetch(fresh, {})
    finally:
        await pool.close()

    assert after == {"pid": before["pid"], "answer": 42}


async def test_a_cancelled_statement_never_hands_its_session_on(dsn: str) -> None:
    """A statement cancelled while the server runs it leaves its session mid-pipeline: the
    pool closes that session, and the next statement gets a fresh one that works."""
    pool = PgConnections(dsn, size=1)
    who = PgStatement(sa.text("SELECT pg_backend_pid() AS pid"))
    try:
        (first,) = await pool.fetch(who, {})
        slow = asyncio.create_task(
            pool.fetch(PgStatement(sa.text("SELECT pg_sleep(5) AS slept")), {})
        )
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        (second,) = await pool.fetch(who, {})
    finally:
        await pool.close()

    assert second["pid"] != first["pid"]


async def test_an_idle_session_whose_server_went_away_costs_no_cpu(dsn: str) -> None:
    """An idle pooled session keeps its socket watched between statements; when the server
    closes it, the unasked-for input must not make the event loop spin (a readable socket
    nobody reads would call its reader at every turn of the loop)."""
    pool = PgConnections(dsn, size=1)
    who = PgStatement(sa.text("SELECT pg_backend_pid() AS pid"))
    try:
        (first,) = await pool.fetch(who, {})
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first["pid"],))
        started = time.process_time()
        await asyncio.sleep(0.5)
        spent = time.process_time() - started
        (second,) = await pool.fetch(who, {})
    finally:
        await pool.close()

    assert spent < 0.2, f"{spent:.2f} s of CPU in 0.5 s idle: the loop spun"
    assert second["pid"] != first["pid"]


async def test_a_statement_whose_table_changed_is_prepared_afresh(dsn: str) -> None:
    """After a migration adds a column, a statement the session had prepared for the old
    table runs again, prepared anew, and returns the new column — instead of failing with
    the server's "cached plan must not change result type"."""
    pool = PgConnections(dsn, size=1)
    everything = PgStatement(sa.text("SELECT * FROM notes"))
    try:
        await make_notes(pool)
        await pool.fetch(PgStatement(sa.text("INSERT INTO notes VALUES ('n1', '{}')")), {})
        assert await pool.fetch(everything, {}) == [{"id": "n1", "body": {}}]
        await pool.fetch(PgStatement(sa.text("ALTER TABLE notes ADD COLUMN extra int")), {})

        rows = await pool.fetch(everything, {})
    finally:
        await pool.close()

    assert rows == [{"id": "n1", "body": {}, "extra": None}]
