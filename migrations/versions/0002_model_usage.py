"""Token usage of the model calls of each turn: turns.input_tokens and turns.output_tokens.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 07:40:00.000000

Nullable integers, so existing rows (and turns whose model reports no usage, such as the
scripted model) read NULL rather than a misleading 0. Adding nullable columns rewrites no row
on PostgreSQL, so the upgrade is instant on a large ``turns`` table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INPUT_COMMENT = "Prompt tokens of all model calls of the turn, as the provider reported them."
OUTPUT_COMMENT = "Completion tokens of all model calls of the turn, as reported."


def upgrade() -> None:
    op.add_column(
        "turns", sa.Column("input_tokens", sa.Integer(), nullable=True, comment=INPUT_COMMENT)
    )
    op.add_column(
        "turns", sa.Column("output_tokens", sa.Integer(), nullable=True, comment=OUTPUT_COMMENT)
    )


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35 has it): a batch copy of `turns` would
    # have to recreate the partial indexes and the views that read the table.
    with op.batch_alter_table("turns", recreate="never") as batch:
        batch.drop_column("output_tokens")
        batch.drop_column("input_tokens")
