"""Assignment, escalation and reminders of approvals: the approval_assignments table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 16:30:00.000000

An open approval may be assigned to a person and/or a group, claimed, released, escalated to
another group by the worker's sweep when it stays open past its interrupt's timeout, and
reminded about once per interval (``engine/assignment.py``, docs/inbox.md). One row per
approval that was ever assigned, escalated or reminded; an approval without a row is assigned
to its interrupt's ``group`` (or nobody). A new table: no existing row is rewritten, so the
upgrade is instant whatever the size of ``tool_calls``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "approval_assignments",
        sa.Column("turn_id", sa.Text, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.Column("assignee", sa.Text, comment="The principal holding the approval (claimed)."),
        sa.Column(
            "assigned_group", sa.Text, comment="The group (role) the approval is assigned to."
        ),
        sa.Column(
            "assigned_by", sa.Text, comment="Who made the last change ('escalation': the sweep)."
        ),
        sa.Column("assigned_at", TIMESTAMP, comment="When the last change was made."),
        sa.Column("escalated_at", TIMESTAMP, comment="When the timeout moved it (at most once)."),
        sa.Column(
            "escalated_from_assignee", sa.Text, comment="The assignee before the escalation."
        ),
        sa.Column("escalated_from_group", sa.Text, comment="The group before the escalation."),
        sa.Column("escalated_to", sa.Text, comment="The group the escalation moved it to."),
        sa.Column(
            "last_reminded_at",
            TIMESTAMP,
            comment="When the last reminder was logged (one per interval across workers).",
        ),
        sa.Column("reminders", sa.Integer, nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            name="fk_approval_assignments_turn_id_tool_calls",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "ref", name="pk_approval_assignments"),
        comment="Assignment, escalation and reminders of approvals (migration 0010).",
    )


def downgrade() -> None:
    op.drop_table("approval_assignments")
