"""Operator reads that cost their page, not the history: ``ix_turns_created_at``,
``ix_turns_failed_or_aborted``, ``ix_approval_queue_open``, and ``ix_turns_version_pending``
in place of ``ix_turns_version_waiting``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 19:45:00.000000

``turnstile turns ls`` (``stores/operations.py`` ``list_turns``) lists turns newest first,
``ORDER BY created_at DESC, id DESC LIMIT n``, with optional filters (status, agent,
``--since``). Without an index on ``created_at`` every page read the whole of ``turns`` and
sorted it. ``ix_turns_created_at (created_at, id)`` holds the listing's order: a page is a
backward scan that stops after ``n`` matching rows, and ``--since`` bounds where it stops.
``created_at`` never changes, so the index costs one entry per new turn and leaves the lease
updates HOT. Turns that failed or were aborted are few among many, so a page of them would
walk far back through that index: ``ix_turns_failed_or_aborted (created_at, id) WHERE status
IN ('failed', 'aborted')`` holds only them, and costs a write only when a turn ends that way.

The metrics' scrape (``stores/monitoring.py``) counts the undecided open approvals per agent
with the oldest of each. ``ix_approval_queue_open (agent, created_at) WHERE decided_at IS
NULL`` holds exactly those rows in that grouping: the scrape is an index-only scan of the
undecided approvals instead of a read of every queue row.

``ix_turns_version_waiting`` (migration 0011) held every turn ever paused: a resumed turn is
not rewritten, so it stayed in the index for good, and the per-version counts and ``turnstile
turns migrate`` read them all. Those reads now find the paused turns through
``approval_queue``, which holds only the open ones; the index is rebuilt as
``ix_turns_version_pending (app_version, agent) WHERE status = 'pending'`` for the queued half,
and no longer grows with history.

On PostgreSQL they are built with a plain ``CREATE INDEX``, which blocks writes to the table
while it reads it: on a large database, create them beforehand with ``CREATE INDEX
CONCURRENTLY`` under the same names and definitions (docs/schema.md), and this migration
finds them and leaves them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNDECIDED = sa.text("decided_at IS NULL")
FAILED_OR_ABORTED = sa.text("status IN ('failed', 'aborted')")
PENDING = sa.text("status = 'pending'")
WAITING = sa.text("status = 'pending' OR finish_reason = 'interrupted'")


def upgrade() -> None:
    op.create_index(
        "ix_turns_version_pending",
        "turns",
        ["app_version", "agent"],
        unique=False,
        if_not_exists=True,
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )
    op.drop_index("ix_turns_version_waiting", table_name="turns", if_exists=True)
    op.create_index(
        "ix_turns_created_at",
        "turns",
        ["created_at", "id"],
        unique=False,
        if_not_exists=True,
    )
    op.create_index(
        "ix_turns_failed_or_aborted",
        "turns",
        ["created_at", "id"],
        unique=False,
        if_not_exists=True,
        postgresql_where=FAILED_OR_ABORTED,
        sqlite_where=FAILED_OR_ABORTED,
    )
    op.create_index(
        "ix_approval_queue_open",
        "approval_queue",
        ["agent", "created_at"],
        unique=False,
        if_not_exists=True,
        postgresql_where=UNDECIDED,
        sqlite_where=UNDECIDED,
    )


def downgrade() -> None:
    op.drop_index(
        "ix_approval_queue_open",
        table_name="approval_queue",
        postgresql_where=UNDECIDED,
        sqlite_where=UNDECIDED,
    )
    op.drop_index(
        "ix_turns_failed_or_aborted",
        table_name="turns",
        postgresql_where=FAILED_OR_ABORTED,
        sqlite_where=FAILED_OR_ABORTED,
    )
    op.drop_index("ix_turns_created_at", table_name="turns")
    op.create_index(
        "ix_turns_version_waiting",
        "turns",
        ["app_version", "agent"],
        postgresql_where=WAITING,
        sqlite_where=WAITING,
    )
    op.drop_index("ix_turns_version_pending", table_name="turns")
