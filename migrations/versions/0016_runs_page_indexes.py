"""The runs page's reads cost their page: ``ix_sessions_owner`` and ``ix_turns_id_prefix``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 22:10:00.000000

The browser's runs page (``/ui/runs``) lists turns newest first through
``ix_turns_created_at`` (migration 0012), as ``turnstile turns ls`` does, with two filters
that index cannot serve. A requester sees only the turns of sessions she owns: without an
index on ``sessions.owner`` her page walked everyone's turns back until it found hers, all of
history for a requester with few. ``ix_sessions_owner (owner)`` finds her sessions, and their
turns come by ``uq_turns_session_id_seq``. The id-prefix search (``LIKE 'ab12%'``) can use a
B-tree on ``turns.id`` only when it orders by bytes; the primary key orders by the database's
collation, so ``ix_turns_id_prefix (id COLLATE "C")`` holds that order on PostgreSQL. It is
collated rather than built with ``text_pattern_ops``: a pattern-ops index also answers
``id = …``, and the planner would take it in place of the primary key on the hot path's
lookups by id; a ``"C"`` index serves only comparisons made in that collation, such as
``LIKE``'s prefix. On SQLite it is a plain index on ``id`` (SQLite's ``LIKE`` ignores case and
reads no index).

On PostgreSQL they are built with a plain ``CREATE INDEX``, which blocks writes to the table
while it reads it: on a large database, create them beforehand with ``CREATE INDEX
CONCURRENTLY`` under the same names and definitions (docs/schema.md), and this migration
finds them and leaves them.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_sessions_owner", "sessions", ["owner"], unique=False, if_not_exists=True)
    op.create_index(
        "ix_turns_id_prefix",
        "turns",
        ["id"],
        unique=False,
        if_not_exists=True,
        postgresql_ops={"id": 'COLLATE "C"'},
    )


def downgrade() -> None:
    op.drop_index("ix_turns_id_prefix", table_name="turns")
    op.drop_index("ix_sessions_owner", table_name="sessions")
