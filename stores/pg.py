"""The hot path's statements on psycopg's own async connections (PostgreSQL only).

SQLAlchemy builds every statement of the store and compiles each of these once; this module
runs the compiled SQL on a small pool of autocommit ``psycopg.AsyncConnection``\\ s, in the
event loop. Why not through SQLAlchemy: for a one-row read on this project's benchmark
machine, SQLAlchemy's execution layer, the connection checkout and return, and the thread
hop (``asyncio.to_thread``) cost 0.52 ms of CPU, and psycopg alone 0.10 ms
(``docs/performance.md``, "Statements on async psycopg"). The common path of an approval
workflow runs about fifteen statements, so that difference was most of the client's and the
worker's CPU per workflow — and, on an idle worker, most of a resumed turn's pickup latency.

Only single statements on autocommit connections run here (each is its own transaction):
the one-statement forms of the common path's writes and reads. Transactions of several
statements (the reference forms, rare) stay on SQLAlchemy in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql.compiler import SQLCompiler

from engine.errors import StoreError

__all__ = ["SESSION_SETTINGS", "PgConnections", "PgStatement", "StatementRefused"]

logger = logging.getLogger("turnstile.store")

# SQLAlchemy's dialect classes are untyped; this one only compiles, it never connects.
_DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]

Row = dict[str, Any]

#: Planner settings of every connection here (see :class:`PgConnections`).
#:
#: ``force_generic_plan``: plan each statement once per connection, for any values.
#:
#: ``enable_bitmapscan = off``: with a plan made for any values, the planner read the queue
#: claim's partial index by a bitmap scan and sorted the result. A bitmap scan visits the
#: heap page of every entry the index still holds, and between two vacuums that index holds
#: an entry for every turn that was pending since, so each claim of a busy queue read
#: hundreds of pages (232 buffers and 382 µs per claim in the benchmark; 33 and 114 µs as
#: an index scan, which also marks the dead entries it passes so later scans skip them).
#: Every statement here finds its rows through a key, where an index scan is the right plan
#: anyway.
#:
#: ``jit = off``: a generic plan's cost estimate grows with the tables (the snapshot read's
#: recursive walk was estimated at 157,000 with 26,000 turns), and past ``jit_above_cost``
#: (100,000 by default) PostgreSQL JIT-compiles the plan again on every execution: 8 ms
#: per snapshot read instead of 0.1 ms. These statements touch a few dozen rows; JIT never
#: pays for itself here.
SESSION_SETTINGS = {
    "plan_cache_mode": "force_generic_plan",
    "enable_bitmapscan": "off",
    "jit": "off",
}


class StatementRefused(StoreError):
    """A constraint refused the statement (an ``IntegrityError``): it wrote nothing."""


class PgStatement:
    """A SQLAlchemy statement compiled once for psycopg, with its parameters' conversions.

    The statement's own constants (``status = 'pending'``, built by SQLAlchemy as
    parameters with a value) are written into the SQL as literals: the connections here
    plan statements once and reuse the plan (see :class:`PgConnections`), and a plan made
    for an unknown ``status`` could not use the partial indexes whose predicate names one.
    ``bind(values)`` passes each value through its bind type's processor (JSON
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
        self.sql: str = sql

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters for psycopg: ``values``, each through its type's processor."""
        params = dict(values)
        for name, process in self._processors.items():
            value = params.get(name)
            if value is not None:
                params[name] = process(value)
        return params


class PgConnections:
    """A pool of autocommit async connections, opened on demand, at most ``size`` busy.

    Each connection plans a statement once and reuses that plan: psycopg prepares a
    statement after a few executions, and ``plan_cache_mode = force_generic_plan`` keeps the
    server from planning it again for each execution's values. Left to choose, PostgreSQL
    kept re-planning the claim (its custom plan looked cheaper than the generic one), and
    planning cost more than running it: 1.5 ms of planning against 0.6 ms of execution in
    ``EXPLAIN ANALYZE``. The statements run here are the common path's short, index-driven
    ones, whose good plan does not depend on the values; their constants are literals in
    the SQL (see :class:`PgStatement`), so partial indexes still apply.

    Connections are not tied to an event loop (psycopg waits on the running one), so a
    store used from several loops — tests, a CLI — keeps its connections.
    """

    def __init__(self, dsn: str, *, size: int = 10) -> None:
        self._dsn = dsn
        self._size = size
        self._idle: list[psycopg.AsyncConnection[Row]] = []
        self._closed = False
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None

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
        bound = [(statement.sql, statement.bind(values)) for statement, values in statements]
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._connection() as connection:
                    if len(bound) == 1:
                        cursors = [await connection.execute(*bound[0])]
                    else:
                        async with connection.pipeline():
                            cursors = [await connection.execute(*each) for each in bound]
                    return [await _rows(cursor) for cursor in cursors]
            except psycopg.IntegrityError as exc:
                raise StatementRefused(f"Database error: {exc!r}") from exc
            except psycopg.OperationalError as exc:
                if attempt <= retries and _connection_lost(exc):
                    logger.warning("database connection lost; retrying (%d/%d)", attempt, retries)
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                raise StoreError(f"Database error: {exc!r}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"Database error: {exc!r}") from exc

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        async with self._slot():
            connection = self._idle.pop() if self._idle else await self._connect()
            try:
                yield connection
            finally:
                # A broken connection (or one left mid-transaction by a cancelled statement)
                # is dropped, never reused.
                idle = psycopg.pq.TransactionStatus.IDLE
                if self._closed or connection.closed or connection.info.transaction_status != idle:
                    await _close_quietly(connection)
                else:
                    self._idle.append(connection)

    def _slot(self) -> asyncio.Semaphore:
        # asyncio primitives belong to the loop that first waits on them: one per loop.
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self._size), loop
        return self._slots

    async def _connect(self) -> psycopg.AsyncConnection[Row]:
        return await psycopg.AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            row_factory=dict_row,
            options=" ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items()),
        )

    async def close(self) -> None:
        """Close the idle connections; busy ones close when their statement returns. The
        pool keeps working afterwards, without pooling: each statement opens and closes its
        own connection."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await _close_quietly(connection)


async def _rows(cursor: psycopg.AsyncCursor[Row]) -> list[Row]:
    # pgresult's field count, not cursor.description: that builds a Column object per
    # field, and a turn's row has twenty (7% of a workflow's CPU).
    result = cursor.pgresult
    return await cursor.fetchall() if result and result.nfields else []


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    # A refused connect, or a session dropped by the server (restart, pg_terminate_backend):
    # class 08 and 57P, or no SQLSTATE at all when the socket just closed. As with the
    # store's transactions, the retry cannot know whether a statement the server had
    # finished committed; the forms run here tolerate that: a repeated creation fails on
    # the turn's primary key, a repeated journal write rewrites the same rows, a repeated
    # settle finds the turn moved (a stale-transition error, as after a lost lease), and
    # turns leased by a claim whose answer was lost are claimed again when that expires.
    return exc.sqlstate is None or exc.sqlstate.startswith(("08", "57P"))


async def _close_quietly(connection: psycopg.AsyncConnection[Row]) -> None:
    with contextlib.suppress(psycopg.Error):  # closing a dead connection releases nothing
        await connection.close()
