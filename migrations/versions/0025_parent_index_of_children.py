"""``ix_turns_parent_id`` holds only turns that have a parent.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 13:20:00.000000

Every read of the index asks for the children of given turns (``parent_id = ...`` or
``parent_id IN (...)``: an inbox row's resume, ``turns show``'s children, retention, and the
foreign key's own check when a turn is deleted), and an equality never matches NULL. Yet every
session's first turn, whose ``parent_id`` is NULL, had an entry, written again at each of its
updates that cannot be HOT (each status change): index work on the write path that no read
used (issue 34). The index now holds the rows ``WHERE parent_id IS NOT NULL``; both databases
prove that condition from the equality, so every read keeps its plan.

On PostgreSQL the index is built again, reading all of ``turns`` under the table's write
lock: on a large database run it in a maintenance window (docs/schema.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_PARENT = "parent_id IS NOT NULL"


def upgrade() -> None:
    op.drop_index("ix_turns_parent_id", table_name="turns")
    op.create_index(
        "ix_turns_parent_id",
        "turns",
        ["parent_id"],
        postgresql_where=sa.text(_HAS_PARENT),
        sqlite_where=sa.text(_HAS_PARENT),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_parent_id", table_name="turns")
    op.create_index("ix_turns_parent_id", "turns", ["parent_id"])
