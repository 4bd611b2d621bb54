"""The trace a turn was created in: turns.trace_context.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 09:00:00.000000

The W3C trace context (``traceparent`` and, when the caller had one, ``tracestate``) of the
request that created a turn, as a JSON object, so the worker that claims the turn later, in
another process, starts its spans as children of that request's span. Nullable: turns created
outside a trace, and every existing row, read NULL. Adding a nullable column without a default
rewrites no row on PostgreSQL, so the upgrade is instant on a large ``turns`` table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = "W3C trace context (traceparent, tracestate) of the request that created it."
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.add_column("turns", sa.Column("trace_context", JSON, nullable=True, comment=COMMENT))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN, as 0002's downgrade: a batch copy of `turns` would
    # have to recreate its partial indexes, triggers and the views that read it.
    with op.batch_alter_table("turns", recreate="never") as batch:
        batch.drop_column("trace_context")
