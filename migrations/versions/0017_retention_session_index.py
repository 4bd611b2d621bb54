"""Retention walks the idle sessions in time order through ``ix_sessions_updated_at``.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 22:00:00.000000

A retention batch (``stores/retention.py``) takes the sessions idle longest, ``WHERE
updated_at < cutoff ORDER BY updated_at, id LIMIT n``. Without an index on ``updated_at``
every batch read all of ``sessions`` and sorted it before its ``LIMIT``, and the planner then
joined whole ``turns`` tables against that misestimate (issue 34). ``ix_sessions_updated_at
(updated_at, id)`` holds that order: a batch reads the index from its oldest entry and stops
once it has ``n`` sessions to delete.

The cost is on turn creation, which moves ``sessions.updated_at``: that update is no longer
HOT and adds an entry to this index and the primary key, one row per new turn, next to the
turn's own insert into ``turns`` and its indexes.

On PostgreSQL it is built with a plain ``CREATE INDEX``, which blocks writes to ``sessions``
(so turn creation) while it reads the table: on a large database, create it beforehand with
``CREATE INDEX CONCURRENTLY`` under the same name and definition (docs/schema.md), and this
migration finds it and leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_sessions_updated_at",
        "sessions",
        ["updated_at", "id"],
        unique=False,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_updated_at", table_name="sessions")
