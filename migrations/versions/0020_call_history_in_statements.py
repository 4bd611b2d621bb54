"""A tool call's history entries are written by the statements that write the journal; the
per-row triggers on ``tool_calls`` and their function are dropped.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 01:20:00.000000

Migration 0013 appended ``tool started`` / ``tool done`` / ``tool failed`` / ``paused`` to
``turn_events`` from triggers on ``tool_calls``: for every journal row written, a trigger
statement looked the turn up and searched the turn's history for the worker that claimed the
attempt (issue 34, docs/performance.md "The statement budget"). The writers already know both:
PostgreSQL's fenced save and settle (``stores/fenced.py``) now append the same entries in the
statement that writes the rows, comparing with the rows as the statement found them, and
SQLite's journal write (``stores/tool_calls.py``) appends them in its transaction. A resume's
answer, a decision and an expiry change neither a call's start nor give it an ending status,
so they wrote no such entry before and write none now. An operator's hand-written ``UPDATE``
of ``tool_calls`` no longer adds entries.

The downgrade restores the triggers and the function for the code of the revision before,
which relies on them (run with this revision's code, a downgraded database would record each
entry twice). The SQL is a copy of 0013's, as history.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The function first, as each trigger names it.
PG_OBJECTS = {
    "turn_history_from_call": """
CREATE FUNCTION turn_history_from_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT NEW.turn_id, t.status,
           'tool started',
           t.attempts,
           (SELECT e.actor FROM turn_events e
            WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
            ORDER BY e.id DESC LIMIT 1),
           NEW.name || ' ' || NEW.ref,
           jsonb_build_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
           NEW.started_at
    FROM turns t
    WHERE t.id = NEW.turn_id
      AND NEW.started_at IS NOT NULL;
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT NEW.turn_id, t.status,
           CASE WHEN NEW.status = 'interrupted' THEN 'paused'
             ELSE 'tool ' || CAST(NEW.status AS TEXT) END,
           t.attempts,
           (SELECT e.actor FROM turn_events e
            WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
            ORDER BY e.id DESC LIMIT 1),
           NEW.name || ' ' || NEW.ref,
           jsonb_build_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
           COALESCE(NEW.finished_at, now())
    FROM turns t
    WHERE t.id = NEW.turn_id
      AND NEW.status IN ('done', 'failed', 'interrupted');
  ELSE
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT NEW.turn_id, t.status,
           'tool started',
           t.attempts,
           (SELECT e.actor FROM turn_events e
            WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
            ORDER BY e.id DESC LIMIT 1),
           NEW.name || ' ' || NEW.ref,
           jsonb_build_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
           NEW.started_at
    FROM turns t
    WHERE t.id = NEW.turn_id
      AND NEW.started_at IS NOT NULL
      AND NEW.started_at IS DISTINCT FROM OLD.started_at;
    INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
    SELECT NEW.turn_id, t.status,
           CASE WHEN NEW.status = 'interrupted' THEN 'paused'
             ELSE 'tool ' || CAST(NEW.status AS TEXT) END,
           t.attempts,
           (SELECT e.actor FROM turn_events e
            WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
            ORDER BY e.id DESC LIMIT 1),
           NEW.name || ' ' || NEW.ref,
           jsonb_build_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
           COALESCE(NEW.finished_at, now())
    FROM turns t
    WHERE t.id = NEW.turn_id
      AND NEW.status IN ('done', 'failed', 'interrupted')
      AND NEW.status IS DISTINCT FROM OLD.status;
  END IF;
  RETURN NULL;
END
$$""",
    "tool_calls_history_insert": """
CREATE TRIGGER tool_calls_history_insert
AFTER INSERT ON tool_calls FOR EACH ROW
WHEN (NEW.started_at IS NOT NULL OR NEW.status IN ('done', 'failed', 'interrupted'))
EXECUTE FUNCTION turn_history_from_call()""",
    "tool_calls_history_update": """
CREATE TRIGGER tool_calls_history_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN (NEW.started_at IS DISTINCT FROM OLD.started_at OR NEW.status IS DISTINCT FROM OLD.status)
EXECUTE FUNCTION turn_history_from_call()""",
}

SQLITE_TRIGGERS = {
    "tool_calls_history_insert": """
CREATE TRIGGER tool_calls_history_insert
AFTER INSERT ON tool_calls FOR EACH ROW
WHEN NEW.started_at IS NOT NULL OR NEW.status IN ('done', 'failed', 'interrupted')
BEGIN
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.turn_id, t.status,
         'tool started',
         t.attempts,
         (SELECT e.actor FROM turn_events e
          WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
          ORDER BY e.id DESC LIMIT 1),
         NEW.name || ' ' || NEW.ref,
         json_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
         NEW.started_at
  FROM turns t
  WHERE t.id = NEW.turn_id
    AND NEW.started_at IS NOT NULL;
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.turn_id, t.status,
         CASE WHEN NEW.status = 'interrupted' THEN 'paused'
           ELSE 'tool ' || CAST(NEW.status AS TEXT) END,
         t.attempts,
         (SELECT e.actor FROM turn_events e
          WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
          ORDER BY e.id DESC LIMIT 1),
         NEW.name || ' ' || NEW.ref,
         json_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
         COALESCE(NEW.finished_at, strftime('%Y-%m-%d %H:%M:%f', 'now'))
  FROM turns t
  WHERE t.id = NEW.turn_id
    AND NEW.status IN ('done', 'failed', 'interrupted');
END""",
    "tool_calls_history_update": """
CREATE TRIGGER tool_calls_history_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN NEW.started_at IS NOT OLD.started_at OR NEW.status IS NOT OLD.status
BEGIN
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.turn_id, t.status,
         'tool started',
         t.attempts,
         (SELECT e.actor FROM turn_events e
          WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
          ORDER BY e.id DESC LIMIT 1),
         NEW.name || ' ' || NEW.ref,
         json_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
         NEW.started_at
  FROM turns t
  WHERE t.id = NEW.turn_id
    AND NEW.started_at IS NOT NULL
    AND NEW.started_at IS NOT OLD.started_at;
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.turn_id, t.status,
         CASE WHEN NEW.status = 'interrupted' THEN 'paused'
           ELSE 'tool ' || CAST(NEW.status AS TEXT) END,
         t.attempts,
         (SELECT e.actor FROM turn_events e
          WHERE e.turn_id = t.id AND e.kind = 'claimed' AND e.attempt = t.attempts
          ORDER BY e.id DESC LIMIT 1),
         NEW.name || ' ' || NEW.ref,
         json_object('round', NEW.round, 'ref', NEW.ref, 'name', NEW.name),
         COALESCE(NEW.finished_at, strftime('%Y-%m-%d %H:%M:%f', 'now'))
  FROM turns t
  WHERE t.id = NEW.turn_id
    AND NEW.status IN ('done', 'failed', 'interrupted')
    AND NEW.status IS NOT OLD.status;
END""",
}

TRIGGERS = ("tool_calls_history_insert", "tool_calls_history_update")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for name in TRIGGERS:
        op.execute(
            f"DROP TRIGGER {name} ON tool_calls"
            if dialect == "postgresql"
            else f"DROP TRIGGER {name}"
        )
    if dialect == "postgresql":
        op.execute("DROP FUNCTION turn_history_from_call()")


def downgrade() -> None:
    statements = PG_OBJECTS if op.get_bind().dialect.name == "postgresql" else SQLITE_TRIGGERS
    for statement in statements.values():
        op.execute(statement)
