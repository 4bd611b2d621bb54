"""SQL of turn admission: the in-flight turns of one principal.

A server limiting each principal's in-flight turns (``create_app(...,
max_turns_per_principal=N)``) reads the ids of the principal's ``pending`` and ``aborting``
turns before it admits another. The read starts from the partial index of active turns
(``ux_turns_one_active_per_session``), so it touches only turns in flight, and it stops after
``limit`` rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stores.schema import ACTIVE, sessions, turns

__all__ = ["active_turn_ids"]

# The partial index's predicate as literals: bound parameters would hide from a generic plan
# that only active turns are wanted, and the index could not be used.
_IN_FLIGHT = sa.text("turns.status IN ({})".format(", ".join(f"'{s}'" for s in ACTIVE)))


def _active_of(owner_clause: sa.ColumnElement[bool]) -> sa.Select[tuple[str]]:
    return (
        sa.select(turns.c.id)
        .join(sessions, sessions.c.id == turns.c.session_id)
        .where(_IN_FLIGHT, owner_clause)
        .limit(sa.bindparam("limit"))
    )


_ACTIVE_OF_OWNER = _active_of(sessions.c.owner == sa.bindparam("owner"))
_ACTIVE_WITHOUT_OWNER = _active_of(sessions.c.owner.is_(None))


def active_turn_ids(connection: Connection, owner: str | None, limit: int) -> list[str]:
    """Ids of at most ``limit`` pending or aborting turns of sessions owned by ``owner``
    (``None``: of sessions without an owner, those of unauthenticated callers)."""
    if owner is None:
        rows = connection.execute(_ACTIVE_WITHOUT_OWNER, {"limit": limit})
    else:
        rows = connection.execute(_ACTIVE_OF_OWNER, {"owner": owner, "limit": limit})
    return [str(row[0]) for row in rows]
