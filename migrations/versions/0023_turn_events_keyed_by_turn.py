"""``turn_events`` keyed by its turn on PostgreSQL, and its ``id`` a 64-bit integer.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 07:00:00.000000

Every reader of a turn's history reads it by turn, in the order its entries were appended
(the timeline, ``turns show``, retention's deletes, the foreign key's cascade); none looks an
entry up by ``id`` alone. Yet each entry paid for two B-tree entries: the primary key on
``id`` and ``ix_turn_events_turn_id`` on ``(turn_id, id)``. On PostgreSQL the primary key is
now ``(turn_id, id)`` itself and the second index is gone: one index entry fewer for each of
the dozen entries a workflow appends (issue 34, docs/performance.md).

``id`` was a 32-bit identity: at a dozen entries per approval workflow it would run out after
about 180 million workflows, and every write that appends history would then fail. It is a
64-bit integer now, on PostgreSQL; SQLite's ``INTEGER PRIMARY KEY`` is 64-bit already.

SQLite keeps ``id`` as its primary key (the rowid, which numbers the entries: a composite key
would leave ``id`` unnumbered there) and ``ix_turn_events_turn_id``; the models mark that index
as SQLite's alone (``stores/schema.py``).

On PostgreSQL the change of type rewrites the table and builds the new key, holding the
table's exclusive lock meanwhile: on a large history run it in a maintenance window
(docs/schema.md). The downgrade restores the two keys and keeps the 64-bit ``id``: narrowing
it could fail on the entries appended since.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from migrations.keep_views import around_views

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: One statement: the table is rewritten once, for the type and the key together. A view
#: reads ``id`` (``turn_timeline``), so it runs with the views set aside.
KEY_BY_TURN = """
ALTER TABLE turn_events
    DROP CONSTRAINT pk_turn_events,
    ALTER COLUMN id TYPE bigint,
    ADD CONSTRAINT pk_turn_events PRIMARY KEY (turn_id, id)"""

KEY_BY_ID = """
ALTER TABLE turn_events
    DROP CONSTRAINT pk_turn_events,
    ADD CONSTRAINT pk_turn_events PRIMARY KEY (id)"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_turn_events_turn_id", table_name="turn_events")
    op.execute(around_views(KEY_BY_TURN))
    # The identity's sequence keeps its own type: widen it with the column.
    op.execute("ALTER SEQUENCE turn_events_id_seq AS bigint")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(KEY_BY_ID)
    op.create_index("ix_turn_events_turn_id", "turn_events", ["turn_id", "id"], unique=False)
