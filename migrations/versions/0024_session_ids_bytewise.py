"""Session ids collated "C" on PostgreSQL, as turn ids are: a session's id prefix reads an index.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 08:00:00.000000

``turnstile turns ls --session S`` takes a session id or its first characters, as every
operator command takes turn ids. A prefix search (``LIKE 's1%'``) can read a B-tree index only
when the index orders the column by bytes; the primary key of ``sessions`` ordered its ids in
the database's default collation, so each such search read every session ever created (issue
34: an operator read that grew with the history). Migration 0021 gave turn ids collation "C" for
the same reason; session ids now share it, and so do the columns holding one — the reference
from ``turns`` and the copy in ``approval_queue`` — since a comparison of two columns takes the
collation of the collated one and an index in another collation could not serve it.

Deterministic collations compare for equality by bytes alike, so no lookup changes what it
finds; only an ``ORDER BY`` of session ids changes, to byte order. SQLite compares text by bytes
already: nothing changes there.

On PostgreSQL the change of collation rebuilds the primary key of ``sessions`` and the indexes
on ``turns.session_id`` and ``approval_queue.session_id`` and checks the foreign key again,
holding each table's exclusive lock meanwhile: on a large database run it in a maintenance
window (docs/schema.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations.keep_views import around_views

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Every column holding a session id, as this migration found the schema.
SESSION_ID_COLUMNS = (("sessions", "id"), ("turns", "session_id"), ("approval_queue", "session_id"))


def _collate_session_ids(collation: str) -> None:
    """Give every session-id column ``collation`` (PostgreSQL), the views around it kept."""
    op.execute(
        around_views(
            *(
                f'ALTER TABLE {table} ALTER COLUMN {column} TYPE text COLLATE "{collation}"'
                for table, column in SESSION_ID_COLUMNS
            )
        )
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _collate_session_ids("C")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _collate_session_ids("default")
