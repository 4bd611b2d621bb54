"""Votes on approvals with an approval policy: the approval_votes table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 15:00:00.000000

An interrupt defined with ``approvers=`` or ``required_approvals=`` is decided by votes: one
row per approver and approval (who, when, the answer, whether it approves). The recorded
decision (``tool_calls.answer``/``decided_by``/``decided_at``) is still written once, when the
quorum is reached or a vote that does not approve decides. A new table: no existing row is
rewritten, so the upgrade is instant whatever the size of ``tool_calls``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "approval_votes",
        sa.Column("turn_id", sa.Text, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.Column("voter", sa.Text, nullable=False, comment="The approver's principal id."),
        sa.Column(
            "answer",
            JSON,
            comment="The vote's answer ({'respond': ...} or {'restart': ...}).",
        ),
        sa.Column(
            "approves",
            sa.Boolean,
            nullable=False,
            comment="Counts towards the quorum; any other vote decided the approval.",
        ),
        sa.Column("voted_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            name="fk_approval_votes_turn_id_tool_calls",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "ref", "voter", name="pk_approval_votes"),
        comment="Votes on approvals whose interrupt has an approval policy (migration 0006).",
    )


def downgrade() -> None:
    op.drop_table("approval_votes")
