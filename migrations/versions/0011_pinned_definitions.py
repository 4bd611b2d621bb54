"""Definitions pinned per turn: turns.app_version and definition_fingerprint, and the table
agent_definitions.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 17:00:00.000000

Every new turn records the application version whose workers may run it and the fingerprint
of its agent's definition (model, system prompt, tools and interrupts with their schemas,
``max_turns``). The definition itself is written once per fingerprint into
``agent_definitions``, so a later diff can say what changed without every turn carrying a
copy. Workers claim only the versions they serve; ``ix_turns_version_waiting`` lets the
operator's ``turnstile turns migrate`` and the per-version queue counts find the pending and
paused turns of one version without reading the rest. Both turn columns are nullable without
a default: existing rows read NULL (unpinned, claimable by any worker) and PostgreSQL rewrites
no row to add them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
WAITING = sa.text("status = 'pending' OR finish_reason = 'interrupted'")


def upgrade() -> None:
    op.add_column(
        "turns",
        sa.Column(
            "app_version",
            sa.Text,
            nullable=True,
            comment="The application version whose workers may run the turn.",
        ),
    )
    op.add_column(
        "turns",
        sa.Column(
            "definition_fingerprint",
            sa.Text,
            nullable=True,
            comment="Hash of the agent definition the turn is pinned to (agent_definitions).",
        ),
    )
    op.create_table(
        "agent_definitions",
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("agent", sa.Text, nullable=False),
        sa.Column("definition", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name="pk_agent_definitions"),
        comment=(
            "Each agent definition turns were pinned to, once per fingerprint (migration 0011)."
        ),
    )
    op.create_index(
        "ix_turns_version_waiting",
        "turns",
        ["app_version", "agent"],
        postgresql_where=WAITING,
        sqlite_where=WAITING,
    )


def downgrade() -> None:
    op.drop_index("ix_turns_version_waiting", table_name="turns")
    # Plain ALTER TABLE ... DROP COLUMN, as 0005's downgrade: a batch copy of `turns` would
    # have to recreate its partial indexes, triggers and the views that read it.
    with op.batch_alter_table("turns", recreate="never") as batch:
        batch.drop_column("definition_fingerprint")
        batch.drop_column("app_version")
    op.drop_table("agent_definitions")
