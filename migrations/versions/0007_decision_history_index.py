"""The history of decided approvals reads an index: ``ix_tool_calls_decided``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 15:30:00.000000

The history (``stores/approvals.py`` ``list_decisions``: the ``/ui`` history page and its CSV)
lists the journal rows with a decision, ``WHERE decided_at IS NOT NULL``, newest first
``ORDER BY decided_at DESC, turn_id DESC, ref DESC``, and pages by the keyset
``(decided_at, turn_id, ref) < (...)``. Without an index each page read every decided row of
``tool_calls`` and sorted them. ``ix_tool_calls_decided`` holds exactly those rows, keyed in
that order: a page is a backward scan of the index that starts at the cursor and stops after
``limit`` rows. Rows without a decision (every plain tool call) stay out of it, so the journal's
hot writes pay for it only when an approval is decided.

On PostgreSQL the index is built with a plain ``CREATE INDEX``, which blocks writes to
``tool_calls`` while it reads the table: on a large journal, create it beforehand with
``CREATE INDEX CONCURRENTLY`` under the same name and definition (docs/schema.md), and this
migration finds it and leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECIDED = sa.text("decided_at IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_tool_calls_decided",
        "tool_calls",
        ["decided_at", "turn_id", "ref"],
        unique=False,
        if_not_exists=True,
        postgresql_where=DECIDED,
        sqlite_where=DECIDED,
    )


def downgrade() -> None:
    op.drop_index(
        "ix_tool_calls_decided",
        table_name="tool_calls",
        postgresql_where=DECIDED,
        sqlite_where=DECIDED,
    )
