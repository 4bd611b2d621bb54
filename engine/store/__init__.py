"""Everything a store backend implements, in one wing: the records it reads and writes
(:mod:`engine.store.records`), the port it implements (:mod:`engine.store.port`), the rules
it applies (:mod:`engine.store.rules`) and the reference in-memory store
(:mod:`engine.store.memory`). This face re-exports the records and the port: ``from
engine.store import SessionStore, TurnRecord``.
"""

from __future__ import annotations

from engine.store import port, records

# Each module's own __all__ is the one list of what it exports, so the face restates none.
from engine.store.port import *  # noqa: F403
from engine.store.records import *  # noqa: F403

__all__ = [*port.__all__, *records.__all__]
