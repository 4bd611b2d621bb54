"""Telling a database that was never migrated (or is behind) from any other store failure.

A store does not check the schema before its first statement (that would cost every process a
query it nearly never needs). Instead, when a statement fails because a table, column, type or
function it names does not exist, the store compares the database's migration revision with
the code's: if they differ, the caller gets :class:`~stores.migrate.SchemaNotAtHeadError`,
which says where the database stands and names ``turnstile migrate``, instead of the driver's
"relation does not exist".
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable

from sqlalchemy.engine import URL

from engine.errors import StoreError
from stores.migrate import SchemaNotAtHeadError, ensure_at_head

__all__ = ["ErrorExplainer", "SchemaCheck", "names_missing_schema"]

logger = logging.getLogger("turnstile.store")

#: Given a driver's error, a typed error that explains it better, or ``None``.
ErrorExplainer = Callable[[BaseException], Awaitable[StoreError | None]]

#: PostgreSQL's undefined_table, undefined_column, undefined_object (an enum type) and
#: undefined_function: what a statement meets on a schema older than the code.
_UNDEFINED_SQLSTATES = frozenset({"42P01", "42703", "42704", "42883"})
#: SQLite says it in words (its result code for these is the generic SQLITE_ERROR).
_SQLITE_MISSING = ("no such table", "no such column", "no such function")


def names_missing_schema(error: BaseException) -> bool:
    """Whether a driver's ``error`` says the statement named something the schema lacks."""
    if getattr(error, "sqlstate", None) in _UNDEFINED_SQLSTATES:
        return True
    return isinstance(error, sqlite3.OperationalError) and str(error).startswith(_SQLITE_MISSING)


class SchemaCheck:
    """The store's :data:`ErrorExplainer`: a missing schema object becomes
    :class:`SchemaNotAtHeadError` when the database is not at the code's migration head."""

    def __init__(self, url: str | URL) -> None:
        self._url = url

    async def __call__(self, error: BaseException) -> StoreError | None:
        if not names_missing_schema(error):
            return None
        try:
            await asyncio.to_thread(ensure_at_head, self._url)
        except SchemaNotAtHeadError as behind:
            return behind
        except Exception as exc:  # the revision could not be read: the original error stands
            logger.debug("could not read the schema revision (%s)", exc)
        return None
