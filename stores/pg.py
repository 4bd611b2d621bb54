"""The hot path's statements, straight on libpq through psycopg (PostgreSQL only).

SQLAlchemy builds every statement of the store and compiles each of these once; this module
runs the compiled SQL on a small pool of autocommit server sessions, in the event loop.

Why not through SQLAlchemy: its execution layer, the connection checkout and return, and the
thread hop cost several times a statement's own client CPU. Why not through psycopg's cursors
and ``psycopg_pool`` either: measured against this module, they cost more throughput than
the project allows (docs/decisions.md, "The hot path on psycopg"). A session is a psycopg
connection whose libpq connection this module drives itself, in pipeline mode, with
psycopg's adapters for parameters and rows.

Only single statements, or several committed together by one pipeline sync, run here: the
one-statement forms of the common path's writes and reads. Transactions of several
round trips (the reference forms, rare) stay on SQLAlchemy in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import abc as psycopg_abc
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.json import set_json_loads
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql.compiler import SQLCompiler

from engine.errors import StoreError
from stores import json_codec

__all__ = ["PLANNER_SETTINGS", "PgConnections", "PgStatement", "StatementRefused", "sql_text"]

logger = logging.getLogger("turnstile.store")

# SQLAlchemy's dialect classes are untyped; this one only compiles, it never connects (its JSON
# serializer is what the JSON columns' bind processors call).
_DIALECT = PGDialect_psycopg(json_serializer=json_codec.dumps)  # type: ignore[no-untyped-call]

Row = dict[str, Any]


def sql_text(expression: sa.ClauseElement) -> str:
    """``expression`` as PostgreSQL SQL text, its values inlined: for a hand-written
    statement that embeds an expression built once for SQLAlchemy statements too."""
    return str(expression.compile(dialect=_DIALECT, compile_kwargs={"literal_binds": True}))


# SQLAlchemy's psycopg dialect writes parameters as %(name)s and a literal % as %%.
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\)s|%)")

#: Planner settings of the hot path's connections, on by default (``SqlSessionStore(...,
#: planner_settings={})`` or ``TURNSTILE_PG_PLANNER=off`` turn them off); why each helps,
#: and what they are worth, is in docs/decisions.md, "Planner settings of the hot path".
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

    The statement's own constants (``status = 'pending'``, built by SQLAlchemy as
    parameters with a value) are written into the SQL as literals: the connections here
    plan statements once and reuse the plan (see :class:`PgConnections`), and a plan made
    for an unknown ``status`` could not use the partial indexes whose predicate names one.
    ``arguments(values)`` passes each value through its bind type's processor (JSON
    serialisation, enum checks), as SQLAlchemy would, so a statement means the same on
    either path.
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
        #: The SQL with psycopg's named placeholders (for running it through psycopg itself,
        #: as the plan tests do, with :attr:`parameter_names` naming :meth:`arguments`).
        self.sql: str = sql
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match[1]
            if name is None:
                return "%"  # a literal percent sign
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"  # a repeated name is one parameter, as in psycopg

        #: The SQL as the server takes it (``$1``, ``$2``, ...) and the names in that order.
        self.wire_sql: bytes = _PLACEHOLDER.sub(number, sql).encode()
        self.parameter_names: tuple[str, ...] = tuple(names)
        #: Its result's column names, read from its first result.
        self.column_names: list[str] = []

    def arguments(self, values: Mapping[str, Any]) -> list[Any]:
        """The parameters in ``$n`` order, each through its type's processor. A missing
        value is a ``KeyError``, as in psycopg."""
        processors = self._processors
        arguments = []
        for name in self.parameter_names:
            value = values[name]
            process = processors.get(name)
            arguments.append(process(value) if process is not None and value is not None else value)
        return arguments


class PgConnections:
    """A pool of autocommit server sessions, opened on demand, at most ``size`` busy.

    Each session prepares every statement the first time it runs it; with ``settings`` of
    :data:`PLANNER_SETTINGS` (the store's default) ``plan_cache_mode = force_generic_plan``
    keeps the server from planning it again for each execution's values, which left to
    choose it did for the claim, at more cost than running it. The statements run here are
    the common path's short, index-driven ones, whose good plan does not depend on the
    values; their constants are literals in the SQL (see :class:`PgStatement`), so partial
    indexes still apply.

    Sessions are not tied to an event loop (each wait is on the running one), so a store
    used from several loops — tests, a CLI — keeps its connections.
    """

    def __init__(
        self, dsn: str, *, size: int = 10, settings: Mapping[str, str] | None = None
    ) -> None:
        self._dsn = dsn
        self._size = size
        self._options = " ".join(f"-c {name}={value}" for name, value in (settings or {}).items())
        self._idle: list[_Session] = []
        self._closed = False
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        #: Turns a driver error into a more telling typed one (see stores/schema_check.py).
        self.explain_error: Callable[[BaseException], Awaitable[StoreError | None]] | None = None

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
        """Run several statements in one round trip and one transaction: a pipeline with a
        single sync, so they commit together (one WAL flush) or not at all. Their rows, in
        order. Errors and retries as :meth:`fetch`."""
        bound = [(statement, statement.arguments(values)) for statement, values in statements]
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._session() as session:
                    return await session.run(bound)
            except psycopg.IntegrityError as exc:
                raise StatementRefused(
                    f"Database error: {exc!r}",
                    sqlstate=exc.diag.sqlstate,
                    constraint=exc.diag.constraint_name,
                ) from exc
            except psycopg.errors.FeatureNotSupported as exc:
                # A table changed under a prepared statement (a migration): the pipeline
                # was rolled back before it ran, and the session has forgotten the stale
                # preparation, so running it again prepares it afresh.
                if attempt <= retries:
                    continue
                raise StoreError(f"Database error: {exc!r}") from exc
            except psycopg.OperationalError as exc:
                lost = _connection_lost(exc)
                if attempt <= retries and lost:
                    logger.warning("database connection lost; retrying (%d/%d)", attempt, retries)
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                raise StoreError(f"Database error: {exc!r}", may_have_applied=lost) from exc
            except psycopg.Error as exc:
                explained = await self.explain_error(exc) if self.explain_error else None
                raise explained or StoreError(f"Database error: {exc!r}") from exc

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[_Session]:
        async with self._slot():
            session = self._idle.pop() if self._idle else _Session(await self._connect())
            try:
                yield session
            finally:
                # A broken session, or one left mid-pipeline by a cancelled or failed read,
                # is dropped, never reused.
                if self._closed or not session.reusable:
                    await session.close()
                else:
                    self._idle.append(session)

    def _slot(self) -> asyncio.Semaphore:
        # asyncio primitives belong to the loop that first waits on them: one per loop.
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self._size), loop
        return self._slots

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        connection = await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, options=self._options
        )
        set_json_loads(json_codec.loads, connection)  # its json and jsonb columns
        return connection

    async def close(self) -> None:
        """Close the idle connections; busy ones close when their statement returns. The
        pool keeps working afterwards, without pooling: each statement opens and closes its
        own connection."""
        self._closed = True
        idle, self._idle = self._idle, []
        for session in idle:
            await session.close()


_statement_names = itertools.count(1)

#: A prepared statement's key in a session: its SQL and its parameters' type OIDs.
_Prepared = tuple[bytes, tuple[int, ...]]


class _Session:
    """One server connection, driven through libpq's pipeline mode.

    psycopg opens the connection; the statements then go straight to its libpq connection
    (``connection.pgconn``), with psycopg's own (C) adapters converting parameters and rows.
    Why not psycopg's cursors: for these one-row statements their Python machinery — query
    conversion, prepared-statement bookkeeping, a reader registered and removed for every
    wait, a cursor and a row maker per execution — cost more CPU than the rest of the
    statement's trip (docs/decisions.md, "The hot path on psycopg").
    What is kept of psycopg: its connection, its type adapters (rows decode exactly as a
    cursor would decode them) and its error classes.

    The connection stays in pipeline mode, where every sync ends an implicit transaction:
    one statement per sync is autocommit, several before one sync commit together. Each
    statement is prepared (a named statement per parameter-type signature, as psycopg
    does) the first time this session runs it, in the same round trip.
    """

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection
        self._pgconn = connection.pgconn
        self._adapt: psycopg_abc.Transformer = Transformer(connection)
        # By SQL (bytes cache their hash) and parameter types: statements are compared by
        # what they say, never by identity (a collected statement's id comes back).
        self._prepared: dict[_Prepared, bytes] = {}
        self._pgconn.enter_pipeline_mode()
        # False from the moment a pipeline is sent until its sync has been read back.
        self._settled = True
        self._wake: asyncio.Future[None] | None = None
        self._idle_readable = False  # the socket was readable since the last sync was read
        self._socket = self._pgconn.socket
        # The loop told to call _readable when the socket is readable: kept from one
        # statement to the next (registering costs two epoll_ctl calls and the selector's
        # bookkeeping every time), dropped when the session idles with input unasked for.
        self._watching: asyncio.AbstractEventLoop | None = None

    @property
    def reusable(self) -> bool:
        """Whether the session is connected and has nothing in flight."""
        return self._settled and self._pgconn.status == pq.ConnStatus.OK

    async def close(self) -> None:
        self._unwatch()  # before the socket closes: a closed descriptor cannot be unregistered
        with contextlib.suppress(psycopg.Error):  # closing a dead connection releases nothing
            await self._connection.close()

    async def run(self, bound: Sequence[tuple[PgStatement, list[Any]]]) -> list[list[Row]]:
        """Send the statements and one sync, then read their results (see the class)."""
        pgconn, adapt = self._pgconn, self._adapt
        # What each result read back belongs to: a statement's preparation, or its
        # execution, with the key its preparation is known by.
        expected: list[tuple[_Prepared, PgStatement | None]] = []
        self._settled = self._idle_readable = False
        for statement, arguments in bound:
            parameters = adapt.dump_sequence(arguments, [PyFormat.AUTO] * len(arguments))
            types = adapt.types or ()
            key = (statement.wire_sql, types)
            name = self._prepared.get(key)
            if name is None:
                name = b"turnstile_%d" % next(_statement_names)
                pgconn.send_prepare(name, statement.wire_sql, param_types=types)
                self._prepared[key] = name
                expected.append((key, None))
            pgconn.send_query_prepared(name, parameters, param_formats=adapt.formats)
            expected.append((key, statement))
        pgconn.pipeline_sync()
        loop = asyncio.get_running_loop()
        self._watch(loop)
        while pgconn.flush():  # 1: the socket's buffer is full, more to send
            await self._writable(loop, self._socket)
        return await self._results(loop, expected)

    async def _results(
        self,
        loop: asyncio.AbstractEventLoop,
        expected: list[tuple[_Prepared, PgStatement | None]],
    ) -> list[list[Row]]:
        pgconn, adapt = self._pgconn, self._adapt
        rows: list[list[Row]] = []
        error: psycopg.Error | None = None
        position = 0
        while True:
            # Wait first: nothing can have come back yet, and reading an empty socket is a
            # system call for nothing.
            self._wake = loop.create_future()
            await self._wake
            pgconn.consume_input()
            ended = False
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    # The end of one statement's results; twice in a row, or on a broken
                    # connection, nothing more has arrived yet.
                    if ended or pgconn.status != pq.ConnStatus.OK:
                        break
                    ended = True
                    continue
                ended = False
                status = result.status
                if status == pq.ExecStatus.PIPELINE_SYNC:
                    self._settled = True
                    if error is not None:
                        raise error
                    return rows
                if position == len(expected):
                    # Every statement has answered, so this is no statement's result: the
                    # server ending the session in place of the sync's reply (a backend
                    # terminated while committing). That is a lost connection, which the
                    # caller retries; whether the commit happened is unknown, as for any
                    # connection lost mid-statement (see _connection_lost).
                    raise _session_ended(result)
                key, statement = expected[position]
                position += 1
                if status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED):
                    # The first error rolled the pipeline's transaction back; what follows
                    # up to the sync comes back PIPELINE_ABORTED, preparations included.
                    if status == pq.ExecStatus.FATAL_ERROR:
                        error = error or psycopg.errors.error_from_result(result)
                    if statement is None or _plan_changed(result):
                        # Not prepared after all; or prepared for a table that has changed
                        # since (a migration): prepare it afresh, under a new name.
                        self._prepared.pop(key, None)
                        if statement is not None:
                            statement.column_names = []
                elif statement is not None:
                    rows.append(_rows(result, adapt, statement) if result.nfields else [])
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(
                    "the connection to the server was lost: "
                    + pgconn.get_error_message(encoding="utf-8")
                )

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._watching is not loop:
            self._unwatch()
            loop.add_reader(self._socket, self._readable)
            self._watching = loop

    def _unwatch(self) -> None:
        loop, self._watching = self._watching, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._socket)

    def _readable(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        elif self._settled and not self._idle_readable:
            # Readable with nothing in flight: usually the loop reporting, once more, input
            # the last statement has read since (the loop polled before that statement's
            # task ran). That happens once; a second time means input nobody asked for.
            self._idle_readable = True
        elif self._settled:
            # A notice, or the server closing the connection: read it, or the loop calls us
            # again at every turn; a connection that broke is no longer watched (its next
            # statement finds it gone).
            try:
                self._pgconn.consume_input()
            except psycopg.OperationalError:
                self._unwatch()
            else:
                if self._pgconn.status != pq.ConnStatus.OK:
                    self._unwatch()

    @staticmethod
    async def _writable(loop: asyncio.AbstractEventLoop, socket: int) -> None:
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(socket, wake)
        try:
            await ready
        finally:
            loop.remove_writer(socket)


def _rows(
    result: pq.abc.PGresult, adapt: psycopg_abc.Transformer, statement: PgStatement
) -> list[Row]:
    """``result``'s rows as dicts, decoded by psycopg's loaders for their column types."""
    adapt.set_pgresult(result)
    names = statement.column_names
    if len(names) != result.nfields:  # the first result (a statement's columns never change)
        names = [(result.fname(column) or b"").decode() for column in range(result.nfields)]
        statement.column_names = names
    return adapt.load_rows(0, result.ntuples, lambda values: dict(zip(names, values, strict=True)))


def _session_ended(result: pq.abc.PGresult) -> psycopg.OperationalError:
    """The error for a result that answers none of the pipeline's statements."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        error = psycopg.errors.error_from_result(result)
        if isinstance(error, psycopg.OperationalError):  # 57P01 and the like
            return error
    # Anything else there means the session's protocol state is lost: drop it and retry.
    return psycopg.OperationalError(
        f"the server sent a result for no statement ({pq.ExecStatus(result.status).name})"
    )


#: The SQLSTATE (feature_not_supported) of a prepared statement whose table changed since it
#: was prepared ("cached plan must not change result type"). Told by code, not by the
#: message, which a server may translate; another error of the class (none of our
#: statements raises one) is only prepared afresh and retried a bounded number of times.
_PLAN_CHANGED = b"0A000"


def _plan_changed(result: pq.abc.PGresult) -> bool:
    return result.error_field(pq.DiagnosticField.SQLSTATE) == _PLAN_CHANGED


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    # A refused connect, or a session dropped by the server (restart, pg_terminate_backend):
    # class 08 and 57P, or no SQLSTATE at all when the socket just closed. As with the
    # store's transactions, the retry cannot know whether a statement the server had
    # finished committed; the forms run here tolerate that: a repeated creation fails on
    # the turn's primary key, a repeated journal write rewrites the same rows, a repeated
    # settle finds the turn moved (a stale-transition error, as after a lost lease), and
    # turns leased by a claim whose answer was lost are claimed again when that expires.
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))
