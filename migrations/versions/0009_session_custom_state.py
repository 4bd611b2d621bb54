"""Genkit's custom session state and artifacts: turns.custom, turns.artifacts and
tool_calls.effects.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 17:00:00.000000

``turns.custom`` and ``turns.artifacts`` hold the session's custom state and artifacts as of
the turn's last committed round (what a failed or aborted turn keeps); they are written in the
statement that commits the round that changed them. ``tool_calls.effects`` lists what one
call changed, so a worker continuing an open round after a crash replays a finished call's
changes instead of running it again. All nullable without a default: adding them rewrites no
row on PostgreSQL, and existing rows read NULL (no custom state, no artifacts, no effects).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")

CUSTOM = "The custom state (Genkit's state.custom) as of the last committed round."
ARTIFACTS = "The session's artifacts [{name, parts, metadata}] as of the last committed round."
EFFECTS = "What the call changed: [{customPatch: [ops]} | {artifact: {...}}], in order."


def upgrade() -> None:
    op.add_column("turns", sa.Column("custom", JSON, nullable=True, comment=CUSTOM))
    op.add_column("turns", sa.Column("artifacts", JSON, nullable=True, comment=ARTIFACTS))
    op.add_column("tool_calls", sa.Column("effects", JSON, nullable=True, comment=EFFECTS))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN, as 0005's downgrade: a batch copy would have to
    # recreate the tables' partial indexes, triggers and the views that read them.
    with op.batch_alter_table("tool_calls", recreate="never") as batch:
        batch.drop_column("effects")
    with op.batch_alter_table("turns", recreate="never") as batch:
        batch.drop_column("artifacts")
        batch.drop_column("custom")
