"""A turn's history, append-only: ``turn_events`` grows ``kind``, ``actor`` and ``detail``;
triggers record claims (and the lost lease a claim takes over) and tool call starts and ends;
``turn_timeline`` reads ``turn_events`` alone.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 21:50:00.000000

Before, the timeline was built from the journal as it is now: ``tool_calls`` rows are updated
in place, so after a worker died mid-call its first attempt, its worker, the lease expiry and
the reclaim vanished, and a pause showed as "tool answered" at the pause's time (issue 32).
Every entry is now appended in the transaction of the change it records, and a trigger refuses
to update one. On an entry that is not a transition, ``to_status`` is the status the turn was
in. Existing rows are status transitions (``kind`` defaults to ``status``); the journal's past is
not back-filled, as what it lost cannot be recovered.

The triggers, their functions and the view are copies, as history: their current definitions
are in ``stores/triggers.py`` and ``stores/views.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")

PG_OBJECTS = {
    "turn_history_from_claim": """
CREATE FUNCTION turn_history_from_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.id, NEW.status, 'lease lost', OLD.attempts, OLD.lease_owner,
         'lease of ' || OLD.lease_owner || ' expired (attempt ' || OLD.attempts || ')', NULL,
         COALESCE(OLD.lease_expires_at, NEW.updated_at)
  WHERE OLD.lease_owner IS NOT NULL;
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  VALUES (NEW.id, NEW.status, 'claimed', NEW.attempts, NEW.lease_owner,
          'claimed by ' || NEW.lease_owner || ' (attempt ' || NEW.attempts || ')', NULL,
          NEW.updated_at);
  RETURN NULL;
END
$$""",
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
    "turn_history_append_only": """
CREATE FUNCTION turn_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'turn_events is append-only: entry % of turn % cannot be changed',
    OLD.id, OLD.turn_id;
END
$$""",
    "turns_history_claim": """
CREATE TRIGGER turns_history_claim
AFTER UPDATE OF attempts ON turns FOR EACH ROW WHEN (NEW.attempts > OLD.attempts)
EXECUTE FUNCTION turn_history_from_claim()""",
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
    "turn_events_append_only": """
CREATE TRIGGER turn_events_append_only
BEFORE UPDATE ON turn_events FOR EACH ROW
EXECUTE FUNCTION turn_history_append_only()""",
}

SQLITE_TRIGGERS = {
    "turns_history_claim": """
CREATE TRIGGER turns_history_claim
AFTER UPDATE OF attempts ON turns FOR EACH ROW WHEN NEW.attempts > OLD.attempts
BEGIN
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.id, NEW.status, 'lease lost', OLD.attempts, OLD.lease_owner,
         'lease of ' || OLD.lease_owner || ' expired (attempt ' || OLD.attempts || ')', NULL,
         COALESCE(OLD.lease_expires_at, NEW.updated_at)
  WHERE OLD.lease_owner IS NOT NULL;
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  VALUES (NEW.id, NEW.status, 'claimed', NEW.attempts, NEW.lease_owner,
          'claimed by ' || NEW.lease_owner || ' (attempt ' || NEW.attempts || ')', NULL,
          NEW.updated_at);
END""",
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
    "turn_events_append_only": """
CREATE TRIGGER turn_events_append_only
BEFORE UPDATE ON turn_events FOR EACH ROW
BEGIN
  SELECT RAISE(ABORT, 'turn_events is append-only');
END""",
}

NEW_VIEW = """
CREATE VIEW turn_timeline AS
SELECT turn_id, id AS seq, at, kind, attempt, actor,
       CASE WHEN kind = 'status'
         THEN COALESCE(CAST(from_status AS TEXT), 'new') || ' -> ' || CAST(to_status AS TEXT)
              || COALESCE(' (' || note || ')', '')
         ELSE COALESCE(note, '')
       END AS detail,
       detail AS data
FROM turn_events"""

OLD_VIEW = """
CREATE VIEW turn_timeline AS
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
FROM tool_calls WHERE decided_at IS NOT NULL"""

#: Each trigger's table, for dropping it.
TABLES = {
    "turns_history_claim": "turns",
    "tool_calls_history_insert": "tool_calls",
    "tool_calls_history_update": "tool_calls",
    "turn_events_append_only": "turn_events",
}

OLD_COMMENT = "Every status transition of every turn (the audit trail)."
NEW_COMMENT = "Every turn's history, append-only: transitions, claims, tool calls, decisions."

FUNCTIONS = ("turn_history_from_claim", "turn_history_from_call", "turn_history_append_only")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW turn_timeline")
    op.add_column(
        "turn_events",
        sa.Column(
            "kind",
            sa.Text(),
            nullable=False,
            server_default="status",
            comment="What happened: status, claimed, lease lost, tool started, decided, vote, ...",
        ),
    )
    op.add_column(
        "turn_events",
        sa.Column(
            "actor",
            sa.Text(),
            comment="Who did it: the worker holding the attempt, or the principal deciding.",
        ),
    )
    op.add_column(
        "turn_events",
        sa.Column(
            "detail", JSON, comment="What the entry is about, as data (its call, answer...)."
        ),
    )
    if dialect == "postgresql":
        op.create_table_comment("turn_events", NEW_COMMENT, existing_comment=OLD_COMMENT)
        for statement in PG_OBJECTS.values():
            op.execute(statement)
    else:
        for statement in SQLITE_TRIGGERS.values():
            op.execute(statement)
    op.execute(NEW_VIEW)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW turn_timeline")
    for name, table in TABLES.items():
        op.execute(
            f"DROP TRIGGER IF EXISTS {name} ON {table}"
            if dialect == "postgresql"
            else f"DROP TRIGGER IF EXISTS {name}"
        )
    if dialect == "postgresql":
        for function in FUNCTIONS:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
        op.create_table_comment("turn_events", OLD_COMMENT, existing_comment=NEW_COMMENT)
    op.execute("DELETE FROM turn_events WHERE kind <> 'status'")
    for column in ("detail", "actor", "kind"):
        op.drop_column("turn_events", column)
    op.execute(OLD_VIEW)
