"""Database connections: URLs, engines, transactions and error wrapping.

SQLAlchemy's synchronous engine runs store operations in a worker thread
(``asyncio.to_thread``), on PostgreSQL (psycopg 3) and SQLite (the standard library's
driver) alike, and the event loop never blocks on I/O. On PostgreSQL the common path's
single statements skip that layer: :attr:`Database.pg` runs them on psycopg's async
connections (``stores/pg.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import URL, Connection, Engine, make_url

from engine.errors import StoreError, TurnstileError
from stores import json_codec
from stores.pg import PgConnections, StatementRefused
from stores.settings import current_settings

__all__ = [
    "DEFAULT_SQLITE_PATH",
    "ENV_URL",
    "Database",
    "default_url",
    "normalise_url",
    "record_from_row",
    "redact",
    "upsert_statement",
    "utc",
]

logger = logging.getLogger("turnstile.store")

ENV_URL = "TURNSTILE_DATABASE_URL"
DEFAULT_SQLITE_PATH = Path(".turnstile") / "turnstile.db"

T = TypeVar("T")
RecordT = TypeVar("RecordT", bound=BaseModel)


def default_url() -> str:
    """The settings' database (``TURNSTILE_DATABASE_URL``, or ``--db`` under ``turnstile
    worker`` and ``serve``), else an SQLite file ``.turnstile/turnstile.db``."""
    return current_settings().database_url


def normalise_url(url: str | URL) -> URL:
    """Pick our drivers: ``postgresql://`` (or ``postgres://``) → psycopg 3; ``sqlite://``
    stays the stdlib one."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and isinstance(url, str):
        location = url.partition("://")[2].partition("?")[0]
        if location.count("@") > 1:
            # The parser would split at the first ``@`` and take the password's tail for the
            # host name, which connection errors then print.
            raise ValueError(
                "the database URL's user name or password holds a raw '@': "
                "percent-encode it as %40."
            )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("postgresql", "sqlite"):
        raise ValueError(f"Unsupported database {parsed.drivername!r}: use PostgreSQL or SQLite.")
    return parsed


#: Query parameters libpq reads as secrets (``?password=`` works as well as ``user:pw@``).
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def redact(url: str | URL) -> str:
    """``url`` as text with its secrets replaced by ``***``, for every log line and message.

    The text is read as written rather than parsed, so a password with a raw ``@`` (which a
    URL parser splits at the first ``@``) is hidden up to the last ``@`` before the query,
    and the ``password`` and ``sslpassword`` query parameters are hidden too.
    """
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    scheme, separator, rest = text.partition("://")
    if not separator:
        return text
    location, question, query = rest.partition("?")
    userinfo, at, host_and_path = location.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        location = f"{user}:***@{host_and_path}" if colon else location
    if question:
        query = "&".join(_redacted_parameter(pair) for pair in query.split("&"))
    return f"{scheme}://{location}{question}{query}"


def _redacted_parameter(pair: str) -> str:
    name, equals, _value = pair.partition("=")
    return f"{name}=***" if equals and unquote(name).lower() in _SECRET_PARAMETERS else pair


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN and cannot take a write lock up front;
    # we open every transaction ourselves with BEGIN IMMEDIATE so that concurrent writers
    # (several worker processes on one file) serialise instead of failing on upgrade.
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


#: Every engine's JSON columns written and read as the hot path's statements do (stores/pg.py),
#: so a payload is stored alike whichever path wrote it.
_JSON_CODEC: dict[str, Any] = {
    "json_serializer": json_codec.dumps,
    "json_deserializer": json_codec.loads,
}


class Database:
    """An engine plus the helpers every store module uses."""

    def __init__(
        self,
        url: str | URL,
        *,
        pool_size: int = 10,
        echo: bool = False,
        planner_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.is_postgres = self.url.get_backend_name() == "postgresql"
        #: Turns a driver error into a more telling typed one (see stores/schema_check.py).
        self.explain_error: Callable[[BaseException], Awaitable[StoreError | None]] | None = None
        if self.is_postgres:
            self.engine = sa.create_engine(
                self.url,
                pool_size=pool_size,
                max_overflow=pool_size,
                # No pre-ping (it costs a round trip per checkout): a dead connection fails its
                # first statement, SQLAlchemy discards the pool, and run() retries once.
                echo=echo,
                # Our transactions last milliseconds; a worker frozen inside one (SIGSTOP, a
                # swapped-out VM) must not keep its row locks — and its turn — forever.
                connect_args={"options": "-c idle_in_transaction_session_timeout=30000"},
                **_JSON_CODEC,
            )
            # Reads get their own pool of autocommit connections: a one-statement read is
            # then one round trip, where a transaction costs three (psycopg sends BEGIN on
            # its own, then the query, then COMMIT). Switching a pooled connection to
            # autocommit per checkout measured slower; connections that are autocommit from
            # the start (isolation level set once, at connect) do not pay that.
            self.read_engine = sa.create_engine(
                self.url,
                pool_size=pool_size,
                max_overflow=pool_size,
                echo=echo,
                isolation_level="AUTOCOMMIT",
                **_JSON_CODEC,
            )
            # The common path's single statements run on psycopg's async connections, in
            # the event loop, with no thread hop (stores/pg.py).
            dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            self.pg: PgConnections | None = PgConnections(
                dsn, size=2 * pool_size, settings=planner_settings
            )
        else:
            database = self.url.database
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            self.engine = sa.create_engine(
                self.url,
                echo=echo,
                connect_args={"check_same_thread": False, "timeout": 30},
                **_JSON_CODEC,
            )
            _configure_sqlite(self.engine)
            # SQLite reads stay in a transaction: it is in-process, so the round trips a
            # transaction adds cost nothing.
            self.read_engine = self.engine
            self.pg = None

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One short transaction (never held across a model call, a tool call or a wait)."""
        with self.engine.begin() as connection:
            yield connection

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection on which each statement is its own transaction: for reads, and for
        writes that are one statement (several would not be atomic together).

        On PostgreSQL an autocommit connection: one round trip per statement, where
        ``BEGIN`` … ``COMMIT`` costs three. A read of several statements is then not one
        snapshot: every multi-statement read of the store reads rows that no longer change,
        or tolerates seeing a later commit. On SQLite, a short transaction (it is
        in-process, so the round trips cost nothing; its ``BEGIN IMMEDIATE`` is also what
        serialises writers there).
        """
        if self.read_engine is self.engine:
            with self.transaction() as connection:
                yield connection
        else:
            with self.read_engine.connect() as connection:
                yield connection

    async def read(self, query: Callable[[Connection], T]) -> T:
        """Run ``query`` on an autocommit connection, in a thread (see :meth:`run`)."""

        def run() -> T:
            with self.autocommit() as connection:
                return query(connection)

        return await self.run(run)

    async def write(self, change: Callable[[Connection], T]) -> T:
        """Run ``change`` in one short transaction, in a thread (see :meth:`run`)."""

        def run() -> T:
            with self.transaction() as connection:
                return change(connection)

        return await self.run(run)

    async def run(self, operation: Callable[[], T], *, retries: int = 3) -> T:
        """Run a blocking store operation in a thread, wrapping driver errors.

        An operation that failed because its connection was lost (a restarted server, a
        terminated backend) is retried on a fresh connection: its transaction never committed.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.to_thread(operation)
            except TurnstileError:
                raise
            except sa.exc.IntegrityError as exc:
                raise _refused(exc.orig) from exc
            except sa.exc.DBAPIError as exc:
                if exc.connection_invalidated and attempt <= retries:
                    logger.warning("database connection lost; retrying (%d/%d)", attempt, retries)
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                explained = (
                    await self.explain_error(exc.orig or exc) if self.explain_error else None
                )
                raise explained or StoreError(
                    f"Database error: {exc.orig!r}", may_have_applied=exc.connection_invalidated
                ) from exc
            except sa.exc.SQLAlchemyError as exc:
                raise StoreError(f"Database error: {exc}") from exc

    @asynccontextmanager
    async def advisory_lock(self, name: str) -> AsyncIterator[bool]:
        """Hold the PostgreSQL session advisory lock ``name`` while the block runs, if it is
        free: yields whether it was (never waits). Its own connection, so the lock lives
        exactly as long as the block."""
        connection = await asyncio.to_thread(self.engine.connect)
        try:
            key = sa.text("SELECT pg_try_advisory_lock(hashtext(:n))")
            got = await asyncio.to_thread(
                lambda: bool(connection.execute(key, {"n": name}).scalar())
            )
            try:
                yield got
            finally:
                if got:
                    await asyncio.to_thread(
                        lambda: connection.execute(
                            sa.text("SELECT pg_advisory_unlock(hashtext(:n))"), {"n": name}
                        )
                    )
        finally:
            await asyncio.to_thread(connection.close)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()


def utc(value: Any) -> Any:
    """SQLite returns naive datetimes: every timestamp we write is UTC, so say so."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def record_from_row(
    record: type[RecordT], row: sa.Row[Any] | Mapping[str, Any], /, **fields: Any
) -> RecordT:
    """``record`` built from ``row`` (SQLAlchemy's, or psycopg's as a dict): each field that
    ``fields`` does not give takes the column of its name, timestamps marked UTC (:func:`utc`),
    and a field with no such column keeps its default. The record's own validation turns the
    stored text and JSON into its enums and nested models."""
    columns = row._mapping if isinstance(row, sa.Row) else row
    stored = {
        name: utc(columns[name])
        for name in record.model_fields
        if name not in fields and name in columns
    }
    return record(**stored, **fields)


def upsert_statement(
    table: sa.Table,
    keys: list[str],
    *,
    update: list[str] | None = None,
    keep: tuple[str, ...] = (),
    returning: str | None = None,
) -> sa.Executable:
    """``INSERT … ON CONFLICT (keys) DO UPDATE`` for PostgreSQL and SQLite alike, as a text
    statement with typed bind parameters (one per column, named after it).

    ``update`` lists the columns an existing row takes from the new one (default: all but
    the keys and ``keep``, which keep their first value). Written as text because SQLAlchemy
    cannot cache the compiled form of its dialects' ``on_conflict_do_update`` constructs
    (logged as ``[no key]``): every execution recompiled them, several times per turn. A
    text clause is compiled once and cached; the typed parameters keep the columns' bind
    processing (JSON serialisation, enum checks).
    """
    columns = [c.name for c in table.columns]
    fixed = set(keys) | set(keep)
    changed = update if update is not None else [c for c in columns if c not in fixed]

    def quoted(names: list[str]) -> str:
        return ", ".join('"' + name + '"' for name in names)

    assignments = ", ".join('"' + c + '" = excluded."' + c + '"' for c in changed)
    sql = (
        f'INSERT INTO "{table.name}" ({quoted(columns)}) '
        f"VALUES ({', '.join(':' + c for c in columns)}) "
        f"ON CONFLICT ({quoted(keys)}) DO UPDATE SET {assignments}"
    )
    bound = sa.text(sql).bindparams(*(sa.bindparam(c.name, type_=c.type) for c in table.columns))
    if returning is None:
        return bound
    # RETURNING needs the result column typed, like any other text query's.
    returning_sql = sa.text(f'{sql} RETURNING "{returning}"').bindparams(
        *(sa.bindparam(c.name, type_=c.type) for c in table.columns)
    )
    return returning_sql.columns(table.c[returning])


def _refused(error: BaseException | None) -> StatementRefused:
    """A driver's integrity error as :class:`StatementRefused`, with the server's own codes."""
    diag = getattr(error, "diag", None)
    return StatementRefused(
        f"Database error: {error!r}",
        sqlstate=getattr(diag, "sqlstate", None),
        constraint=getattr(diag, "constraint_name", None),
        sqlite_error=getattr(error, "sqlite_errorname", None),
    )
