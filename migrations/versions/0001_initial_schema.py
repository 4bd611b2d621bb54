"""Initial schema: sessions, turns, messages, tool_calls, turn_events and the operator views.

Revision ID: 0001
Revises:
Create Date: 2026-12-01 04:35:35.110146
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        comment="One conversation with one agent: a chain (or tree) of turns.",
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.Text(), nullable=False, comment="The snapshot id."),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False, comment="1, 2, ... within the session."),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Text(), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "aborting",
                "completed",
                "failed",
                "aborted",
                name="turn_status",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("finish_reason", sa.Text(), nullable=True),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("history_length", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("lease_token", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_after", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["parent_id"], ["turns.id"], name=op.f("fk_turns_parent_id_turns")),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_turns_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_turns_session_id_seq")),
        comment="One row per turn = per snapshot; status is the turn state machine.",
    )
    op.create_index(
        "ix_turns_claimable",
        "turns",
        ["run_after", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_turns_aborting",
        "turns",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'aborting'"),
        sqlite_where=sa.text("status = 'aborting'"),
    )
    op.create_index("ix_turns_parent_id", "turns", ["parent_id"], unique=False)
    op.create_index(
        "ux_turns_one_active_per_session",
        "turns",
        ["session_id"],
        unique=True,
        postgresql_where=sa.text("status IN ('pending', 'aborting')"),
        sqlite_where=sa.text("status IN ('pending', 'aborting')"),
    )
    op.create_table(
        "messages",
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column(
            "content",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("committed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_messages_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "position", name=op.f("pk_messages")),
        comment="The conversation, one row per message, by the turn and round that wrote it.",
    )
    op.create_table(
        "tool_calls",
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "requested",
                "running",
                "done",
                "failed",
                "interrupted",
                "answered",
                name="tool_call_status",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "output",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "interrupt",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column(
            "resumed",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "answer",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_tool_calls_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "ref", name=op.f("pk_tool_calls")),
        comment="The journal: one row per tool request, keyed by (turn, round, ref).",
    )
    op.create_index(
        "ix_tool_calls_deadline",
        "tool_calls",
        ["deadline"],
        unique=False,
        postgresql_where=sa.text("status = 'interrupted' AND deadline IS NOT NULL"),
        sqlite_where=sa.text("status = 'interrupted' AND deadline IS NOT NULL"),
    )
    op.create_index(
        "ix_tool_calls_open",
        "tool_calls",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'interrupted'"),
        sqlite_where=sa.text("status = 'interrupted'"),
    )
    op.create_table(
        "turn_events",
        sa.Column("id", sa.Integer(), sa.Identity(always=False), nullable=False),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column(
            "from_status",
            sa.Enum(
                "pending",
                "aborting",
                "completed",
                "failed",
                "aborted",
                name="turn_status",
                create_constraint=True,
            ),
            nullable=True,
        ),
        sa.Column(
            "to_status",
            sa.Enum(
                "pending",
                "aborting",
                "completed",
                "failed",
                "aborted",
                name="turn_status",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_turn_events_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turn_events")),
        comment="Every status transition of every turn (the audit trail).",
    )
    op.create_index("ix_turn_events_turn_id", "turn_events", ["turn_id", "id"], unique=False)
    for name, sql in _views(op.get_bind().dialect.name).items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in reversed(list(_views(op.get_bind().dialect.name))):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_turn_events_turn_id", table_name="turn_events")
    op.drop_table("turn_events")
    op.drop_index(
        "ix_tool_calls_open",
        table_name="tool_calls",
        postgresql_where=sa.text("status = 'interrupted'"),
        sqlite_where=sa.text("status = 'interrupted'"),
    )
    op.drop_index(
        "ix_tool_calls_deadline",
        table_name="tool_calls",
        postgresql_where=sa.text("status = 'interrupted' AND deadline IS NOT NULL"),
        sqlite_where=sa.text("status = 'interrupted' AND deadline IS NOT NULL"),
    )
    op.drop_table("tool_calls")
    op.drop_table("messages")
    op.drop_index(
        "ux_turns_one_active_per_session",
        table_name="turns",
        postgresql_where=sa.text("status IN ('pending', 'aborting')"),
        sqlite_where=sa.text("status IN ('pending', 'aborting')"),
    )
    op.drop_index("ix_turns_parent_id", table_name="turns")
    op.drop_index(
        "ix_turns_claimable",
        table_name="turns",
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.drop_table("turns")
    op.drop_table("sessions")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TYPE IF EXISTS tool_call_status")
        op.execute("DROP TYPE IF EXISTS turn_status")


def _views(dialect: str) -> dict[str, str]:
    """The operator views (docs/schema.md), with the dialect's clock arithmetic."""
    if dialect == "postgresql":
        now = "now()"
        age = "EXTRACT(EPOCH FROM now() - {col})"
        minute_ago = "now() - interval '1 minute'"
    else:
        now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
        age = "(julianday('now') - julianday({col})) * 86400.0"
        minute_ago = "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 minute')"
    return {
        # One row per unanswered interrupt of a session's latest turn.
        "open_approvals": f"""
            SELECT c.turn_id, t.session_id, t.agent, c.name AS interrupt, c.ref, c.input,
                   c.interrupt AS metadata, c.deadline, c.created_at,
                   {age.format(col="c.created_at")} AS age_seconds
            FROM tool_calls c
            JOIN turns t ON t.id = c.turn_id
            WHERE c.status = 'interrupted'
              AND t.status = 'completed' AND t.finish_reason = 'interrupted'
              AND NOT EXISTS (
                  SELECT 1 FROM turns later
                  WHERE later.session_id = t.session_id AND later.seq > t.seq)""",
        # Running turns that need a look: lease expired, retrying, stopping, or unclaimed.
        "stuck_turns": f"""
            SELECT id AS turn_id, session_id, agent, status, attempts, max_attempts,
                   lease_owner, lease_expires_at, run_after, error, created_at, updated_at,
                   CASE
                     WHEN lease_owner IS NOT NULL AND lease_expires_at < {now}
                       THEN 'lease expired'
                     WHEN status = 'aborting' THEN 'aborting'
                     WHEN attempts > 1 THEN 'retrying'
                     ELSE 'waiting for a worker'
                   END AS reason
            FROM turns
            WHERE status IN ('pending', 'aborting')
              AND ((lease_owner IS NOT NULL AND lease_expires_at < {now})
                   OR status = 'aborting'
                   OR attempts > 1
                   OR (lease_owner IS NULL AND run_after < {minute_ago}))""",
        # Everything that happened to a turn, in order.
        "turn_timeline": """
            SELECT turn_id, at, 'status' AS kind,
                   COALESCE(CAST(from_status AS TEXT), 'new') || ' -> ' || CAST(to_status AS TEXT)
                     || COALESCE(' (' || note || ')', '') AS detail
            FROM turn_events
            UNION ALL
            SELECT turn_id, created_at, 'message',
                   'round ' || CAST(round AS TEXT) || ': ' || role
                     || CASE WHEN committed THEN '' ELSE ' (open)' END
            FROM messages
            UNION ALL
            SELECT turn_id, started_at, 'tool started', name || ' ' || ref
            FROM tool_calls WHERE started_at IS NOT NULL
            UNION ALL
            SELECT turn_id, finished_at, 'tool ' || CAST(status AS TEXT), name || ' ' || ref
            FROM tool_calls WHERE finished_at IS NOT NULL
            UNION ALL
            SELECT turn_id, decided_at, 'decided',
                   name || ' ' || ref || ' by ' || COALESCE(decided_by, 'unknown')
            FROM tool_calls WHERE decided_at IS NOT NULL""",
    }
