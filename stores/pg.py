"""The PostgreSQL hot path: single statements, or a few committed together, run on a pool of
psycopg async connections.

SQLAlchemy builds every statement of the store; the one-statement forms of the common path's
writes and reads are compiled once (:class:`PgStatement`) and run here through psycopg's
public API — ``AsyncConnection.execute(..., prepare=True)``, ``pipeline()`` and
``transaction()`` — on a ``psycopg_pool`` pool, in the event loop. Transactions of several
round trips stay on SQLAlchemy in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql.compiler import SQLCompiler

from engine.errors import StoreError
from stores import json_codec

__all__ = ["PLANNER_SETTINGS", "PgConnections", "PgStatement", "StatementRefused"]

logger = logging.getLogger("turnstile.store")

# SQLAlchemy's dialect classes are untyped; this one only compiles, it never connects (its JSON
# serializer is what the JSON columns' bind processors call).
_DIALECT = PGDialect_psycopg(json_serializer=json_codec.dumps)  # type: ignore[no-untyped-call]

Row = dict[str, Any]
Connection = psycopg.AsyncConnection[DictRow]

# SQLAlchemy's psycopg dialect writes parameters as %(name)s and a literal % as %%.
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|%)")

#: Planner settings for the hot path's connections, opt-in (``SqlSessionStore(...,
#: planner_settings=PLANNER_SETTINGS)``, or ``TURNSTILE_PG_PLANNER=hot-path``); why each
#: helps is in docs/decisions.md, "Planner settings of the hot path".
PLANNER_SETTINGS: Mapping[str, str] = {
    "plan_cache_mode": "force_generic_plan",
    "enable_bitmapscan": "off",
    "enable_seqscan": "off",
    "jit": "off",
}


class StatementRefused(StoreError):
    """A constraint refused the statement (an ``IntegrityError``): it wrote nothing.

    ``sqlstate`` and ``constraint`` are PostgreSQL's own (``diag``), ``sqlite_error`` SQLite's
    extended result code name: callers tell the constraints apart without reading the
    message, whatever the server's language.
    """

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        constraint: str | None = None,
        sqlite_error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.constraint = constraint
        self.sqlite_error = sqlite_error


class PgStatement:
    """A SQLAlchemy statement compiled once for psycopg, with its parameters' conversions.

    The statement's own constants (``status = 'pending'``, built by SQLAlchemy as parameters
    with a value) are written into the SQL as literals: statements are prepared and may run
    from a plan made for any values, and such a plan could not use the partial indexes whose
    predicate names a status it does not know. ``arguments(values)`` passes each value
    through its bind type's processor (JSON serialisation, enum checks), as SQLAlchemy
    would, so a statement means the same on either path.
    """

    def __init__(self, statement: sa.ClauseElement) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        assert isinstance(compiled, SQLCompiler)
        sql = compiled.string
        self._processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            if bind.expanding:
                raise ValueError(f"{name}: expanding parameters need = ANY(...) here")
            impl = bind.type.dialect_impl(_DIALECT)
            if not bind.required and bind.callable is None:
                render = impl.literal_processor(_DIALECT)
                if render is None:
                    raise ValueError(f"{name}: no literal form for the constant {bind.value!r}")
                sql = sql.replace(f"%({name})s", render(bind.value))
                continue
            process = impl.bind_processor(_DIALECT)
            if process is not None:
                self._processors[name] = process
        #: The SQL with psycopg's named placeholders.
        self.sql: str = sql
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match[1]
            if name is None:
                return "%"  # a literal percent sign
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"  # a repeated name is one parameter, as in psycopg

        #: The SQL as the server receives it from psycopg (``$1``, ``$2``, ...), for plan
        #: checks that prepare it by hand, and the parameter names in that order.
        self.wire_sql: bytes = _PLACEHOLDER.sub(number, sql).encode()
        self.parameter_names: tuple[str, ...] = tuple(names)

    def arguments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters by name, each through its type's processor. A missing value is a
        ``KeyError``, as in psycopg."""
        processors = self._processors
        arguments = {}
        for name in self.parameter_names:
            value = values[name]
            process = processors.get(name)
            arguments[name] = process(value) if process is not None and value is not None else value
        return arguments


class PgConnections:
    """Autocommit connections from a ``psycopg_pool`` pool (at most ``size`` open), one pool
    per event loop, so a store used from several loops (tests, a CLI) keeps working.

    Every statement is prepared on a connection the first time it runs there
    (``prepare=True``). ``settings`` are server settings for every connection (see
    :data:`PLANNER_SETTINGS`); ``wait_timeout`` bounds the wait for a free connection.
    After :meth:`close` each statement opens and closes a connection of its own, so a
    closed store holds none.
    """

    def __init__(
        self,
        dsn: str,
        *,
        size: int = 10,
        settings: Mapping[str, str] | None = None,
        wait_timeout: float = 30.0,
    ) -> None:
        self._dsn = dsn
        self._size = size
        self._wait_timeout = wait_timeout
        self._options = " ".join(f"-c {name}={value}" for name, value in (settings or {}).items())
        self._pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[Connection]] = {}
        self._closed = False

    async def fetch(
        self, statement: PgStatement, values: Mapping[str, Any], *, retries: int = 3
    ) -> list[Row]:
        """Run one statement; its rows as dicts (none for a statement without a result).

        A statement whose connection was lost (a restarted server, a terminated backend) is
        retried on a fresh connection, like the store's transactions. Errors are
        :class:`~engine.errors.StoreError`; a constraint's refusal is
        :class:`StatementRefused`.
        """
        (rows,) = await self.fetch_together([(statement, values)], retries=retries)
        return rows

    async def fetch_together(
        self,
        statements: Sequence[tuple[PgStatement, Mapping[str, Any]]],
        *,
        retries: int = 3,
    ) -> list[list[Row]]:
        """Run several statements in one round trip and one transaction (a pipeline), so
        they commit together or not at all. Their rows, in order. Errors and retries as
        :meth:`fetch`."""
        bound = [(statement, statement.arguments(values)) for statement, values in statements]
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._connection() as connection:
                    return await _run(connection, bound)
            except psycopg.IntegrityError as exc:
                raise StatementRefused(
                    f"Database error: {exc!r}",
                    sqlstate=exc.diag.sqlstate,
                    constraint=exc.diag.constraint_name,
                ) from exc
            except psycopg.errors.FeatureNotSupported as exc:
                # A table changed under a prepared statement (a migration): the connection
                # that prepared it was dropped, and a fresh one prepares it anew.
                if attempt <= retries and _plan_changed(exc):
                    continue
                raise StoreError(f"Database error: {exc!r}") from exc
            except PoolTimeout as exc:
                # Every connection stayed busy: nothing was sent, so nothing applied.
                raise StoreError(f"Database busy: {exc}") from exc
            except psycopg.OperationalError as exc:
                lost = _connection_lost(exc)
                if attempt <= retries and lost:
                    logger.warning("database connection lost; retrying (%d/%d)", attempt, retries)
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                raise StoreError(f"Database error: {exc!r}", may_have_applied=lost) from exc
            except psycopg.Error as exc:
                raise StoreError(f"Database error: {exc!r}") from exc

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        if self._closed:
            connection = await self._connect()
            try:
                yield connection
            finally:
                await connection.close()
            return
        pool = await self._pool()
        async with pool.connection() as connection:
            try:
                yield connection
            except psycopg.errors.FeatureNotSupported as exc:
                if _plan_changed(exc):
                    await connection.close()  # its prepared statements are stale: dropped
                raise

    async def _pool(self) -> AsyncConnectionPool[Connection]:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for gone in [other for other in self._pools if other.is_closed()]:
                del self._pools[gone]  # its connections closed with it
            pool = AsyncConnectionPool(
                self._dsn,
                connection_class=Connection,
                kwargs=self._connect_arguments(),
                configure=_configure,
                min_size=0,
                max_size=self._size,
                timeout=self._wait_timeout,
                open=False,
                name="turnstile-hot-path",
            )
            self._pools[loop] = pool
            await pool.open()
        return pool

    def _connect_arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if self._options:
            arguments["options"] = self._options
        return arguments

    async def _connect(self) -> Connection:
        connection = await Connection.connect(self._dsn, **self._connect_arguments())
        await _configure(connection)
        return connection

    async def close(self) -> None:
        """Close this loop's pool (statements still running return their connections
        closed); later statements each use a connection of their own (see the class)."""
        self._closed = True
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()


async def _configure(connection: Connection) -> None:
    set_json_loads(json_codec.loads, connection)  # its json and jsonb columns


async def _run(
    connection: Connection, bound: Sequence[tuple[PgStatement, dict[str, Any]]]
) -> list[list[Row]]:
    """Run the statements: one on its own (autocommit), several as one pipelined
    transaction (one round trip)."""
    if len(bound) == 1:
        ((statement, arguments),) = bound
        cursor = await connection.execute(statement.sql, arguments, prepare=True)
        return [await cursor.fetchall() if cursor.description else []]
    cursors = []
    async with connection.pipeline(), connection.transaction():
        for statement, arguments in bound:
            cursors.append(await connection.execute(statement.sql, arguments, prepare=True))
    return [await cursor.fetchall() if cursor.description else [] for cursor in cursors]


def _plan_changed(exc: psycopg.Error) -> bool:
    # "cached plan must not change result type": a prepared statement whose table changed
    # (feature_not_supported). No statement here uses an unsupported feature otherwise, and
    # a retry of one would fail again, bounded by the retries.
    return exc.diag.sqlstate == "0A000"


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    # A refused connect, or a session dropped by the server (restart, pg_terminate_backend):
    # class 08 and 57P, or no SQLSTATE at all when the socket just closed. As with the
    # store's transactions, the retry cannot know whether a statement the server had
    # finished committed; the forms run here tolerate that: a repeated creation fails on
    # the turn's primary key (the engine then reads the turn back), a repeated journal write
    # rewrites the same rows, a repeated settle finds the turn moved (a stale-transition
    # error, as after a lost lease), and turns leased by a claim whose answer was lost are
    # claimed again when that expires.
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))
