"""Session stores: implementations of :class:`engine.store.SessionStore`.

``InMemorySessionStore`` is the reference implementation (it lives in the engine, which also
uses it as the scratch store of client-managed state); ``SqlSessionStore`` is the durable one
on PostgreSQL or SQLite, whose schema only Alembic changes (:func:`migrate`).
"""

from __future__ import annotations

from engine.store import SessionStore
from engine.store.memory import InMemorySessionStore
from stores.database import default_url
from stores.migrate import SchemaNotAtHeadError, ensure_at_head, migrate
from stores.sql import SqlSessionStore

__all__ = [
    "InMemorySessionStore",
    "SchemaNotAtHeadError",
    "SessionStore",
    "SqlSessionStore",
    "default_url",
    "ensure_at_head",
    "migrate",
]
