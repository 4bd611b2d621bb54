"""SQL for ``agent_definitions``: each agent definition turns were pinned to, once per
fingerprint.

A turn records only its definition's fingerprint; the description itself (what a diff on a
refused resume or ``turnstile turns migrate`` compares) is written here once. The store writes
a fingerprint the first time it creates a turn pinned to it (and remembers that it did, so
later turns pay nothing), in its own short transaction before the turn's: a turn never names
a fingerprint whose row is missing. ``INSERT … ON CONFLICT DO NOTHING`` makes the write
idempotent across processes: a fingerprint is a hash of the description, so the first row
written is as good as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stores.schema import JSON, TIMESTAMP, agent_definitions

__all__ = ["read_definition", "save_definition"]

#: Built once as text: SQLAlchemy cannot cache its dialects' ON CONFLICT constructs.
_SAVE = sa.text(
    "INSERT INTO agent_definitions (fingerprint, agent, definition, created_at) "
    "VALUES (:fingerprint, :agent, :definition, :now) ON CONFLICT (fingerprint) DO NOTHING"
).bindparams(
    sa.bindparam("fingerprint", type_=sa.Text),
    sa.bindparam("agent", type_=sa.Text),
    sa.bindparam("definition", type_=JSON),
    sa.bindparam("now", type_=TIMESTAMP),
)

_BY_FINGERPRINT = sa.select(agent_definitions.c.definition).where(
    agent_definitions.c.fingerprint == sa.bindparam("fingerprint")
)


def save_definition(
    connection: Connection,
    *,
    fingerprint: str,
    agent: str,
    definition: Mapping[str, Any],
    now: datetime,
) -> None:
    """Write ``definition`` under ``fingerprint`` unless a row has it already."""
    connection.execute(
        _SAVE,
        {"fingerprint": fingerprint, "agent": agent, "definition": dict(definition), "now": now},
    )


def read_definition(connection: Connection, fingerprint: str) -> dict[str, Any] | None:
    """The definition written under ``fingerprint``, or ``None`` if none was."""
    value = connection.execute(_BY_FINGERPRINT, {"fingerprint": fingerprint}).scalar_one_or_none()
    return dict(value) if value is not None else None
