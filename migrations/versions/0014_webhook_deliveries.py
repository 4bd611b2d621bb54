"""The outbox of outgoing webhooks about approvals: the webhook_deliveries table.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 22:00:00.000000

One row per webhook event (an approval opened, reminded, escalated or decided) and endpoint,
written with the change it reports and delivered at least once by the workers, with retries
(``engine/approvals/webhooks.py``, docs/webhooks.md). A new table: no existing row is
rewritten, so the upgrade is instant whatever the size of ``tool_calls``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Text, nullable=False, comment="Derived from event_id and url."),
        sa.Column(
            "event_id", sa.Text, nullable=False, comment="The event's id, alike for each url."
        ),
        sa.Column(
            "event", sa.Text, nullable=False, comment="opened, reminded, escalated, decided."
        ),
        sa.Column("turn_id", sa.Text, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("ref", sa.Text, nullable=False),
        sa.Column(
            "url", sa.Text, nullable=False, comment="The endpoint (its secret is not stored)."
        ),
        sa.Column("body", sa.Text, nullable=False, comment="The request body every attempt sends."),
        sa.Column("occurred_at", TIMESTAMP, nullable=False, comment="When the event happened."),
        sa.Column(
            "status",
            sa.Text,
            nullable=False,
            server_default="pending",
            comment="pending, delivered, or failed (attempts exhausted).",
        ),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", TIMESTAMP, nullable=False, comment="Due from then on."),
        sa.Column("lease_token", sa.Text, comment="The claim of the worker sending it now."),
        sa.Column("lease_expires_at", TIMESTAMP, comment="When another worker may claim it again."),
        sa.Column("last_error", sa.Text, comment="Why the last attempt failed."),
        sa.Column("delivered_at", TIMESTAMP, comment="When the endpoint accepted it."),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            name="fk_webhook_deliveries_turn_id_tool_calls",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        comment="The outbox of webhook deliveries about approvals (migration 0014).",
    )
    op.create_index(
        "ix_webhook_deliveries_turn_id",
        "webhook_deliveries",
        ["turn_id", "round", "ref", "event"],
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_webhook_deliveries_opened",
        "webhook_deliveries",
        ["occurred_at"],
        postgresql_where=sa.text("event = 'opened'"),
        sqlite_where=sa.text("event = 'opened'"),
    )


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
