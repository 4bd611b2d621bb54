"""Two indexes fewer on the write path: turn ids collated "C", retention walks the turns.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 01:30:00.000000

Every new turn and every status change that cannot be a HOT update adds an entry to each
index of ``turns`` whose condition the row meets, and each new turn updates its session's
``updated_at``; two indexes paid on those writes served only operators' reads (issue 34).

``ix_turns_id_prefix`` (migration 0016) repeated the primary key in collation "C" so that an
id-prefix search (``LIKE 'ab12%'``) could read an index in byte order. On PostgreSQL the turn
id itself is now collated "C": the primary key serves the prefix search and the lookups by
id alike (the ids are UUID text, whose equality is the same in any deterministic collation).
Every column holding a turn id takes the same collation — the references from ``messages``,
``tool_calls``, ``turn_events``, the approval tables, ``webhook_deliveries`` and
``turns.parent_id`` — because a comparison of two columns takes the collation of the
collated one, and an index in another collation cannot serve it: a join of ``messages`` to
``turns`` would read all of ``messages``. The views reading those columns are dropped and
created again from their own definitions, since PostgreSQL does not change the type of a
column a view reads.

``ix_sessions_updated_at`` (migration 0017) served retention's walk; retention now walks
``turns`` by ``ix_turns_created_at`` (migration 0012) and keeps each session's latest turn,
whose creation is the session's last activity, so the session's update is HOT again.

SQLite compares text by bytes already; its copy of ``ix_turns_id_prefix`` was a plain index
on ``id`` that no read used. Both indexes are dropped there too.

On PostgreSQL the change of collation rebuilds the primary keys and indexes of those columns
and checks their foreign keys again, holding each table's exclusive lock meanwhile: on a
large database run it in a maintenance window.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations.keep_views import around_views

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Every column holding a turn id, by table, as this migration found the schema.
TURN_ID_COLUMNS = (
    ("turns", "id"),
    ("turns", "parent_id"),
    ("messages", "turn_id"),
    ("tool_calls", "turn_id"),
    ("turn_events", "turn_id"),
    ("approval_queue", "turn_id"),
    ("approval_votes", "turn_id"),
    ("approval_assignments", "turn_id"),
    ("webhook_deliveries", "turn_id"),
)


def _collate_turn_ids(collation: str) -> None:
    """Give every turn-id column ``collation`` (PostgreSQL), the views around it kept."""
    changes = []
    for table in dict.fromkeys(table for table, _ in TURN_ID_COLUMNS):
        columns = ", ".join(
            f'ALTER COLUMN {column} TYPE text COLLATE "{collation}"'
            for owner, column in TURN_ID_COLUMNS
            if owner == table
        )
        changes.append(f"ALTER TABLE {table} {columns}")
    op.execute(around_views(*changes))


def upgrade() -> None:
    op.drop_index("ix_turns_id_prefix", table_name="turns", if_exists=True)
    op.drop_index("ix_sessions_updated_at", table_name="sessions", if_exists=True)
    if op.get_bind().dialect.name == "postgresql":
        _collate_turn_ids("C")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _collate_turn_ids("default")
    op.create_index("ix_sessions_updated_at", "sessions", ["updated_at", "id"], unique=False)
    op.create_index(
        "ix_turns_id_prefix",
        "turns",
        ["id"],
        unique=False,
        postgresql_ops={"id": 'COLLATE "C"'},
    )
