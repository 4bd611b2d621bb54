"""Escalation chains: ``approval_assignments.escalation_step``, the step an approval reached.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 22:10:00.000000

``on_timeout={"escalate": [...]}`` moves an unanswered approval along a chain of groups, each
step after its own wait (``engine/escalation.py``, docs/inbox.md). The row records
the step reached, 0 before any; ``escalated_at``, ``escalated_from_*`` and ``escalated_to``
now describe the last step. The sweep's guarded UPDATE moves an approval from the step it
read, so each step happens once with several workers. An approval escalated before this
migration moved its one step: its row is set to step 1. Adding a column with a constant
default rewrites no row on PostgreSQL; the backfill touches only escalated approvals.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
STEP_COMMENT = "The step of the escalation chain reached (0: not escalated); migration 0015."
ESCALATED_AT_COMMENT = "When the last step of the escalation chain moved it."
OLD_ESCALATED_AT_COMMENT = "When the timeout moved it (at most once)."


def _comment_escalated_at(comment: str, previous: str) -> None:
    # SQLite keeps no comments: only PostgreSQL's changes (a batch copy would rebuild the table).
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "approval_assignments",
            "escalated_at",
            existing_type=TIMESTAMP,
            comment=comment,
            existing_comment=previous,
        )


def upgrade() -> None:
    op.add_column(
        "approval_assignments",
        sa.Column(
            "escalation_step", sa.Integer, nullable=False, server_default="0", comment=STEP_COMMENT
        ),
    )
    _comment_escalated_at(ESCALATED_AT_COMMENT, OLD_ESCALATED_AT_COMMENT)
    op.execute("UPDATE approval_assignments SET escalation_step = 1 WHERE escalated_at IS NOT NULL")


def downgrade() -> None:
    _comment_escalated_at(OLD_ESCALATED_AT_COMMENT, ESCALATED_AT_COMMENT)
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35 has it), as migration 0002 drops.
    with op.batch_alter_table("approval_assignments", recreate="never") as batch:
        batch.drop_column("escalation_step")
