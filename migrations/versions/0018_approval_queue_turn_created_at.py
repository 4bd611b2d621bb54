"""``approval_queue`` carries its turn's ``created_at``: the paused turns listed newest first
through ``ix_approval_queue_turn_created_at``.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 01:00:00.000000

``turnstile turns ls --status paused`` (and the runs page's "paused" filter) lists the turns
paused at approvals now, newest first. It walked ``ix_turns_created_at`` backwards and kept
the turns found in ``approval_queue``: every turn ever paused and since resumed is
``completed`` / ``interrupted`` too, so a page of 50 visited the turns created since the 50th
paused one — all of history when few are paused (issue 34). The queue holds exactly the
paused turns' calls; with the turn's ``created_at`` on each entry, ``turn_created_at``, and
``ix_approval_queue_turn_created_at (turn_created_at, turn_id)``, a page reads the queue
newest first and stops after its turns (a turn with several open approvals has several
entries, adjacent in that order).

The triggers copy ``turns.created_at`` when they add an entry, as they copy ``session_id`` and
``agent``; Turnstile never changes a turn's ``created_at``, so it is not tracked. The column is
filled from ``turns`` for the entries already queued, then made NOT NULL. SQLite cannot make a
column NOT NULL in place: the table is copied (Alembic's batch mode), with the queue's
triggers and the view ``open_approvals`` dropped around the copy (SQLite refuses to rename a
table while a view or trigger names one that does not exist) and created again after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from textwrap import indent

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
COMMENT = "The turn's created_at (copied; migration 0018)."
INDEX = "ix_approval_queue_turn_created_at"

FILL = """
UPDATE approval_queue
SET turn_created_at = (SELECT t.created_at FROM turns t WHERE t.id = approval_queue.turn_id)"""

#: The queue's triggers, each on its table: both databases drop and create them by these names.
TRIGGERS = {
    "tool_calls_queue_insert": "tool_calls",
    "tool_calls_queue_update": "tool_calls",
    "turns_queue_update": "turns",
    "turns_queue_insert": "turns",
}


# -- The queue's triggers, written with (0018) or without (0003 to 0017) the turn's created_at --


def _insert_entry(turn_created: bool) -> str:
    extra = ", turn_created_at" if turn_created else ""
    return f"""INSERT INTO approval_queue (turn_id, round, ref, session_id, agent, name, input,
                            interrupt, deadline, decided_at, created_at{extra})"""


def _add_call(turn_created: bool, guard: str = "") -> str:
    """The INSERT giving the journal row ``NEW`` its entry when its turn is paused and latest."""
    extra = ", t.created_at" if turn_created else ""
    return f"""{_insert_entry(turn_created)}
SELECT NEW.turn_id, NEW.round, NEW.ref, t.session_id, t.agent, NEW.name, NEW.input,
       NEW.interrupt, NEW.deadline, NEW.decided_at, NEW.created_at{extra}
FROM turns t
WHERE {guard}t.id = NEW.turn_id
  AND t.status = 'completed' AND t.finish_reason = 'interrupted'
  AND NOT EXISTS (
      SELECT 1 FROM turns later
      WHERE later.session_id = t.session_id AND later.seq > t.seq)
-- The turn's trigger may have added it already: when one statement settles the turn
-- and writes its calls (the store's one-statement settle), both triggers fire at its
-- end and both see the call interrupted on a paused turn.
ON CONFLICT DO NOTHING;"""


def _add_turn_calls(turn_created: bool) -> str:
    """The paused turn ``NEW``'s interrupted calls as entries, unless a later turn superseded
    it; each user ends the statement."""
    extra = ", NEW.created_at" if turn_created else ""
    return f"""{_insert_entry(turn_created)}
SELECT c.turn_id, c.round, c.ref, NEW.session_id, NEW.agent, c.name, c.input,
       c.interrupt, c.deadline, c.decided_at, c.created_at{extra}
FROM tool_calls c
WHERE c.turn_id = NEW.id AND c.status = 'interrupted'
  AND NOT EXISTS (
      SELECT 1 FROM turns later
      WHERE later.session_id = NEW.session_id AND later.seq > NEW.seq)"""


def _pg_functions(turn_created: bool) -> list[str]:
    """``CREATE OR REPLACE`` of the two functions that add entries (the supersede function
    only deletes them and stays as it is)."""
    return [
        f"""
CREATE OR REPLACE FUNCTION approval_queue_from_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF OLD.status = 'interrupted' AND NEW.status = 'interrupted' THEN
      -- An entry that may exist already (a decision, an edit): lock its turn first, so a
      -- new turn superseding it concurrently (approval_queue_supersede) waits for this
      -- transaction, or this one for it, and the second sees the first's rows.
      PERFORM 1 FROM turns WHERE id = NEW.turn_id FOR KEY SHARE;
    END IF;
    DELETE FROM approval_queue
    WHERE turn_id = OLD.turn_id AND round = OLD.round AND ref = OLD.ref;
  END IF;
  IF NEW.status = 'interrupted' THEN
{indent(_add_call(turn_created), "    ")}
  END IF;
  RETURN NULL;
END
$$""",
        f"""
CREATE OR REPLACE FUNCTION approval_queue_from_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'completed' AND NEW.finish_reason = 'interrupted' THEN
{indent(_add_turn_calls(turn_created), "    ")}
    ON CONFLICT DO NOTHING;
  ELSE
    DELETE FROM approval_queue WHERE turn_id = OLD.id;
  END IF;
  RETURN NULL;
END
$$""",
    ]


def _sqlite_triggers(turn_created: bool) -> list[str]:
    return [
        f"""
CREATE TRIGGER tool_calls_queue_insert
AFTER INSERT ON tool_calls FOR EACH ROW WHEN NEW.status = 'interrupted'
BEGIN
{indent(_add_call(turn_created), "  ")}
END""",
        f"""
CREATE TRIGGER tool_calls_queue_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN OLD.status = 'interrupted' OR NEW.status = 'interrupted'
BEGIN
  DELETE FROM approval_queue
  WHERE turn_id = OLD.turn_id AND round = OLD.round AND ref = OLD.ref;
{indent(_add_call(turn_created, "NEW.status = 'interrupted' AND "), "  ")}
END""",
        f"""
CREATE TRIGGER turns_queue_update
AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW
WHEN (NEW.status = 'completed' AND NEW.finish_reason IS 'interrupted')
  <> (OLD.status = 'completed' AND OLD.finish_reason IS 'interrupted')
BEGIN
  DELETE FROM approval_queue WHERE turn_id = OLD.id;
{indent(_add_turn_calls(turn_created), "  ")}
    AND NEW.status = 'completed' AND NEW.finish_reason = 'interrupted';
END""",
        """
CREATE TRIGGER turns_queue_insert
AFTER INSERT ON turns FOR EACH ROW WHEN NEW.seq > 1
BEGIN
  DELETE FROM approval_queue
  WHERE session_id = NEW.session_id
    AND turn_id IN (
        SELECT id FROM turns WHERE session_id = NEW.session_id AND seq < NEW.seq);
END""",
    ]


# The view as migration 0003 left it on SQLite, recreated around the table's copy (SQLite
# refuses to rename a table a view names). Kept here rather than read from the database, so
# that `turnstile migrate --sql` can print this migration without one.
SQLITE_OPEN_APPROVALS = """CREATE VIEW open_approvals AS
            SELECT q.turn_id, q.session_id, q.agent, q.name AS interrupt, q.ref, q.input,
                   q.interrupt AS metadata, q.deadline, q.created_at,
                   (julianday('now') - julianday(q.created_at)) * 86400.0 AS age_seconds
            FROM approval_queue q"""


def _sqlite_queue_table() -> sa.Table:
    """``approval_queue`` as 0017 left it, with the column just added: the copy is made from
    this rather than from a reflection, so that ``turnstile migrate --sql`` can print it."""
    undecided = sa.text("decided_at IS NULL")
    return sa.Table(
        "approval_queue",
        sa.MetaData(),
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("agent", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("input", sa.JSON(), nullable=True),
        sa.Column("interrupt", sa.JSON(), nullable=True),
        sa.Column("deadline", TIMESTAMP, nullable=True),
        sa.Column("decided_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("turn_created_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            name="fk_approval_queue_turn_id_tool_calls",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "ref", name="pk_approval_queue"),
        sa.Index("ix_approval_queue_created_at", "created_at", "turn_id", "ref"),
        sa.Index("ix_approval_queue_session_id", "session_id"),
        sa.Index("ix_approval_queue_open", "agent", "created_at", sqlite_where=undecided),
    )


def _drop_sqlite_triggers() -> None:
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _drop_sqlite_triggers()
    op.add_column("approval_queue", sa.Column("turn_created_at", TIMESTAMP, comment=COMMENT))
    op.execute(FILL)
    if dialect == "postgresql":
        op.alter_column("approval_queue", "turn_created_at", nullable=False)
        for statement in _pg_functions(turn_created=True):
            op.execute(statement)
    else:
        op.execute("DROP VIEW open_approvals")
        with op.batch_alter_table(
            "approval_queue", recreate="always", copy_from=_sqlite_queue_table()
        ) as batch:
            batch.alter_column("turn_created_at", existing_type=TIMESTAMP, nullable=False)
        op.execute(SQLITE_OPEN_APPROVALS)
        for statement in _sqlite_triggers(turn_created=True):
            op.execute(statement)
    op.create_index(INDEX, "approval_queue", ["turn_created_at", "turn_id"], if_not_exists=True)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_index(INDEX, table_name="approval_queue")
    if dialect == "postgresql":
        for statement in _pg_functions(turn_created=False):
            op.execute(statement)
        op.drop_column("approval_queue", "turn_created_at")
        return
    # SQLite drops a column in place unless a trigger names it.
    _drop_sqlite_triggers()
    with op.batch_alter_table("approval_queue", recreate="never") as batch:
        batch.drop_column("turn_created_at")
    for statement in _sqlite_triggers(turn_created=False):
        op.execute(statement)
