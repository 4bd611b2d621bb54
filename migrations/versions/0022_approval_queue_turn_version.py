"""``approval_queue`` carries its turn's ``app_version``: the paused turns counted by version
from the queue alone.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 01:45:00.000000

``turnstile stats`` counts the waiting turns of each (agent, version). The paused ones were
found through ``approval_queue`` and then read from ``turns`` one by one for their version: a
primary-key probe per open approval, scattered over the whole history's pages (issue 34). The
queue's triggers now copy the turn's ``app_version`` as they copy its ``agent`` and
``created_at``, so the count reads the queue only. The column stays nullable: turns created
before definitions were pinned (migration 0011) carry no version. Turnstile never changes a
turn's version once it is created, so the copy is not kept in step with later updates.

Adding a nullable column needs no table copy on either database; on SQLite the queue's triggers
are dropped and created again around it, on PostgreSQL the two functions that add entries are
replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from textwrap import indent

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = "The turn's app_version (copied; migration 0022)."

FILL = """
UPDATE approval_queue
SET turn_app_version = (SELECT t.app_version FROM turns t WHERE t.id = approval_queue.turn_id)"""

#: The queue's triggers, each on its table: both databases drop and create them by these names.
TRIGGERS = {
    "tool_calls_queue_insert": "tool_calls",
    "tool_calls_queue_update": "tool_calls",
    "turns_queue_update": "turns",
    "turns_queue_insert": "turns",
}


# -- The queue's triggers, written with (0022) or without (0018 to 0021) the turn's version ---


def _insert_entry(versioned: bool) -> str:
    extra = ", turn_app_version" if versioned else ""
    return f"""INSERT INTO approval_queue (turn_id, round, ref, session_id, agent, name, input,
                            interrupt, deadline, decided_at, created_at, turn_created_at{extra})"""


def _add_call(versioned: bool, guard: str = "") -> str:
    """The INSERT giving the journal row ``NEW`` its entry when its turn is paused and latest."""
    extra = ", t.app_version" if versioned else ""
    return f"""{_insert_entry(versioned)}
SELECT NEW.turn_id, NEW.round, NEW.ref, t.session_id, t.agent, NEW.name, NEW.input,
       NEW.interrupt, NEW.deadline, NEW.decided_at, NEW.created_at, t.created_at{extra}
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


def _add_turn_calls(versioned: bool) -> str:
    """The paused turn ``NEW``'s interrupted calls as entries, unless a later turn superseded
    it; each user ends the statement."""
    extra = ", NEW.app_version" if versioned else ""
    return f"""{_insert_entry(versioned)}
SELECT c.turn_id, c.round, c.ref, NEW.session_id, NEW.agent, c.name, c.input,
       c.interrupt, c.deadline, c.decided_at, c.created_at, NEW.created_at{extra}
FROM tool_calls c
WHERE c.turn_id = NEW.id AND c.status = 'interrupted'
  AND NOT EXISTS (
      SELECT 1 FROM turns later
      WHERE later.session_id = NEW.session_id AND later.seq > NEW.seq)"""


def _pg_functions(versioned: bool) -> list[str]:
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
{indent(_add_call(versioned), "    ")}
  END IF;
  RETURN NULL;
END
$$""",
        f"""
CREATE OR REPLACE FUNCTION approval_queue_from_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'completed' AND NEW.finish_reason = 'interrupted' THEN
{indent(_add_turn_calls(versioned), "    ")}
    ON CONFLICT DO NOTHING;
  ELSE
    DELETE FROM approval_queue WHERE turn_id = OLD.id;
  END IF;
  RETURN NULL;
END
$$""",
    ]


def _sqlite_triggers(versioned: bool) -> list[str]:
    return [
        f"""
CREATE TRIGGER tool_calls_queue_insert
AFTER INSERT ON tool_calls FOR EACH ROW WHEN NEW.status = 'interrupted'
BEGIN
{indent(_add_call(versioned), "  ")}
END""",
        f"""
CREATE TRIGGER tool_calls_queue_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN OLD.status = 'interrupted' OR NEW.status = 'interrupted'
BEGIN
  DELETE FROM approval_queue
  WHERE turn_id = OLD.turn_id AND round = OLD.round AND ref = OLD.ref;
{indent(_add_call(versioned, "NEW.status = 'interrupted' AND "), "  ")}
END""",
        f"""
CREATE TRIGGER turns_queue_update
AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW
WHEN (NEW.status = 'completed' AND NEW.finish_reason IS 'interrupted')
  <> (OLD.status = 'completed' AND OLD.finish_reason IS 'interrupted')
BEGIN
  DELETE FROM approval_queue WHERE turn_id = OLD.id;
{indent(_add_turn_calls(versioned), "  ")}
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


def _drop_sqlite_triggers() -> None:
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _drop_sqlite_triggers()
    op.add_column("approval_queue", sa.Column("turn_app_version", sa.Text(), comment=COMMENT))
    op.execute(FILL)
    statements = _pg_functions(True) if dialect == "postgresql" else _sqlite_triggers(True)
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for statement in _pg_functions(False):
            op.execute(statement)
        op.drop_column("approval_queue", "turn_app_version")
        return
    # SQLite drops a column in place unless a trigger names it.
    _drop_sqlite_triggers()
    with op.batch_alter_table("approval_queue", recreate="never") as batch:
        batch.drop_column("turn_app_version")
    for statement in _sqlite_triggers(False):
        op.execute(statement)
