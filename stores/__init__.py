"""Session stores: implementations of :class:`engine.store.SessionStore`.

``InMemorySessionStore`` is the reference implementation (it lives in the engine, which also
uses it as the scratch store of client-managed state); the SQL store joins it here.
"""

from __future__ import annotations

from engine.memory_store import InMemorySessionStore
from engine.store import SessionStore

__all__ = ["InMemorySessionStore", "SessionStore"]
