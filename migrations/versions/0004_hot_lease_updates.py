"""Lease updates (claims, heartbeats) become HOT updates of ``turns``; ``turns`` is vacuumed
sooner.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 11:50:00.000000

A claim sets the lease columns of a pending turn and a heartbeat extends its lease. Neither
changes what a turn is (its status, session, order), but ``ix_turns_aborting`` indexed
``lease_expires_at``, so every claim and every heartbeat was a non-HOT update: a new entry in
each of the table's six indexes, including the claim's own partial index
``ix_turns_claimable``, whose dead entries every later claim scans until a vacuum removes them
(docs/performance.md). The index now holds the aborting turns' ids only (they are few; the
lease expiry is checked on their rows), so lease updates change no indexed column, and
``fillfactor = 80`` leaves room on each page for the new row version to stay there — the two
conditions of a HOT update. Rows already stored keep their pages; new ones get the room.

A settle still leaves a dead entry in ``ix_turns_claimable`` (the row stops being pending), and
the claim, which reads that index oldest first, steps over every such entry until a vacuum
removes it, so pickups slow down as the dead entries pile up. PostgreSQL's default waits for
a fifth of a table to be dead; ``turns`` is now vacuumed after 1,000 dead rows plus 1% of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ABORTING = sa.text("status = 'aborting'")


def _aborting_index(column: str) -> None:
    op.drop_index(
        "ix_turns_aborting", table_name="turns", postgresql_where=ABORTING, sqlite_where=ABORTING
    )
    op.create_index(
        "ix_turns_aborting",
        "turns",
        [column],
        unique=False,
        postgresql_where=ABORTING,
        sqlite_where=ABORTING,
    )


def upgrade() -> None:
    _aborting_index("id")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE turns SET (fillfactor = 80, autovacuum_vacuum_threshold = 1000, "
            "autovacuum_vacuum_scale_factor = 0.01)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE turns RESET "
            "(fillfactor, autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor)"
        )
    _aborting_index("lease_expires_at")
