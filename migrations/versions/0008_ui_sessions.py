"""Browser sessions of the inbox UI as rows, and the sign-in failure counters.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 16:30:00.000000

``ui_sessions``: one row per signed-in browser; the cookie carries only the row's id, signed,
so revoking the row (logout, ``turnstile ui sessions revoke``) ends the session in every
server process at once. ``ui_login_failures``: failed sign-ins per client address and per
account name in fixed windows, shared by every server process. Two new tables: nothing
existing is rewritten.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.Text, nullable=False, comment="What the signed cookie carries."),
        sa.Column("principal", sa.Text, nullable=False, comment="Who signed in."),
        sa.Column("roles", JSON, nullable=False, comment="The principal's roles at sign-in."),
        sa.Column("csrf", sa.Text, nullable=False, comment="The session's CSRF token."),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("last_seen_at", TIMESTAMP, nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=False, comment="The absolute end."),
        sa.Column("revoked_at", TIMESTAMP, comment="Logout or an operator's revoke; NULL: not."),
        sa.Column("user_agent", sa.Text, nullable=False, server_default=""),
        sa.Column("client_address", sa.Text, nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("id", name="pk_ui_sessions"),
        comment="Signed-in browsers of the inbox UI (migration 0008).",
    )
    op.create_index("ix_ui_sessions_principal", "ui_sessions", ["principal"])
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"])
    op.create_table(
        "ui_login_failures",
        sa.Column("key", sa.Text, nullable=False, comment="'address:...' or 'account:...'."),
        sa.Column(
            "failures",
            sa.Integer,
            nullable=False,
            comment="Sign-in attempts in the window not known to have succeeded.",
        ),
        sa.Column("window_started_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_ui_login_failures"),
        comment=(
            "Failed sign-ins of the inbox UI per client address and account (migration 0008)."
        ),
    )


def downgrade() -> None:
    op.drop_table("ui_login_failures")
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_index("ix_ui_sessions_principal", table_name="ui_sessions")
    op.drop_table("ui_sessions")
