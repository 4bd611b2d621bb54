"""The approval queue: open approvals kept in a small table of their own, by triggers.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:00:00.000000

Listing the open approvals (target T3 in docs/performance.md) used to join every interrupted
journal row to its turn and anti-join the session's later turns: several scattered buffer hits
per row, on every listing. ``approval_queue`` holds exactly the rows
that view returned — one per ``interrupted`` journal row of a turn that is ``completed`` /
``interrupted`` and still its session's latest — densely, in ``created_at`` order, so the view
becomes a plain scan of a small index.

Triggers keep it exact on every write path (the store's upserts, answers, inbox decisions,
expiry, retention, an operator's UPDATE) without a round trip from Python:

* ``tool_calls`` after INSERT of an interrupted row, and after UPDATE when the old or new row is
  interrupted (an upsert's ``ON CONFLICT DO UPDATE`` fires the UPDATE triggers on both
  databases): the row's entry is removed, then re-inserted if the row is interrupted and its
  turn paused and latest;
* ``turns`` after UPDATE when the turn becomes or stops being paused: its interrupted calls are
  added, or its entries removed (a settle may write the turn before or after its calls);
* ``turns`` after INSERT (from the session's second turn on): the session's older turns'
  entries go — a newer turn supersedes them;
* deleting a journal row deletes its entry through the foreign key (ON DELETE CASCADE).

The WHEN clauses keep the cost off the hot path: heartbeats, claims and every journal write of a
call that is not interrupted never call a trigger function. ``session_id``, ``seq`` and
``agent`` of a turn are never changed by Turnstile and are not tracked.

On PostgreSQL a decision re-writing an entry and a new turn superseding it can run at once; both
lock the paused turn's row (the decision ``FOR KEY SHARE``, the supersede ``FOR UPDATE``) before
touching the queue, so whichever comes second sees the other's committed rows. SQLite runs one
writer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

COLUMNS = (
    "turn_id, round, ref, session_id, agent, name, input, interrupt, deadline, decided_at, "
    "created_at"
)

# The view as 0001 defined it: the backfill reads it, and the downgrade puts it back.
OLD_VIEW = """
            SELECT c.turn_id, t.session_id, t.agent, c.name AS interrupt, c.ref, c.input,
                   c.interrupt AS metadata, c.deadline, c.created_at,
                   {age} AS age_seconds
            FROM tool_calls c
            JOIN turns t ON t.id = c.turn_id
            WHERE c.status = 'interrupted'
              AND t.status = 'completed' AND t.finish_reason = 'interrupted'
              AND NOT EXISTS (
                  SELECT 1 FROM turns later
                  WHERE later.session_id = t.session_id AND later.seq > t.seq)"""

NEW_VIEW = """
            SELECT q.turn_id, q.session_id, q.agent, q.name AS interrupt, q.ref, q.input,
                   q.interrupt AS metadata, q.deadline, q.created_at,
                   {age} AS age_seconds
            FROM approval_queue q"""

BACKFILL = f"""
INSERT INTO approval_queue ({COLUMNS})
SELECT c.turn_id, c.round, c.ref, t.session_id, t.agent, c.name, c.input, c.interrupt,
       c.deadline, c.decided_at, c.created_at
FROM tool_calls c
JOIN turns t ON t.id = c.turn_id
WHERE c.status = 'interrupted'
  AND t.status = 'completed' AND t.finish_reason = 'interrupted'
  AND NOT EXISTS (
      SELECT 1 FROM turns later WHERE later.session_id = t.session_id AND later.seq > t.seq)"""

# -- PostgreSQL: one plpgsql function per source, called only when its WHEN clause holds ------

_ENTRY_OF_CALL = f"""
        INSERT INTO approval_queue ({COLUMNS})
        SELECT NEW.turn_id, NEW.round, NEW.ref, t.session_id, t.agent, NEW.name, NEW.input,
               NEW.interrupt, NEW.deadline, NEW.decided_at, NEW.created_at
        FROM turns t
        WHERE t.id = NEW.turn_id
          AND t.status = 'completed' AND t.finish_reason = 'interrupted'
          AND NOT EXISTS (
              SELECT 1 FROM turns later
              WHERE later.session_id = t.session_id AND later.seq > t.seq)
        -- The turn's trigger may have added it already: when one statement settles the turn
        -- and writes its calls (the store's one-statement settle), both triggers fire at its
        -- end and both see the call interrupted on a paused turn.
        ON CONFLICT DO NOTHING;"""

_ENTRIES_OF_TURN = f"""
        INSERT INTO approval_queue ({COLUMNS})
        SELECT c.turn_id, c.round, c.ref, NEW.session_id, NEW.agent, c.name, c.input,
               c.interrupt, c.deadline, c.decided_at, c.created_at
        FROM tool_calls c
        WHERE c.turn_id = NEW.id AND c.status = 'interrupted'
          AND NOT EXISTS (
              SELECT 1 FROM turns later
              WHERE later.session_id = NEW.session_id AND later.seq > NEW.seq)"""

PG_FUNCTIONS = {
    "approval_queue_from_call": f"""
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
      IF NEW.status = 'interrupted' THEN{_ENTRY_OF_CALL}
      END IF;
      RETURN NULL;
    END""",
    "approval_queue_from_turn": f"""
    BEGIN
      IF NEW.status = 'completed' AND NEW.finish_reason = 'interrupted' THEN{_ENTRIES_OF_TURN}
        ON CONFLICT DO NOTHING;
      ELSE
        DELETE FROM approval_queue WHERE turn_id = OLD.id;
      END IF;
      RETURN NULL;
    END""",
    "approval_queue_supersede": """
    BEGIN
      IF EXISTS (SELECT 1 FROM approval_queue WHERE session_id = NEW.session_id) THEN
        -- Wait for a concurrent decision re-writing one of these entries (it holds its turn
        -- FOR KEY SHARE): the DELETE below then sees the entry it wrote.
        PERFORM 1 FROM turns t JOIN approval_queue q ON q.turn_id = t.id
        WHERE q.session_id = NEW.session_id AND t.seq < NEW.seq
        FOR UPDATE OF t;
        DELETE FROM approval_queue q
        WHERE q.session_id = NEW.session_id
          AND q.turn_id IN (
              SELECT t.id FROM turns t WHERE t.session_id = NEW.session_id AND t.seq < NEW.seq);
      END IF;
      RETURN NULL;
    END""",
}

_PAUSED_CHANGED = (
    "(NEW.status = 'completed' AND NEW.finish_reason {same} 'interrupted') <> "
    "(OLD.status = 'completed' AND OLD.finish_reason {same} 'interrupted')"
)

PG_TRIGGERS = {
    "tool_calls_queue_insert": (
        "AFTER INSERT ON tool_calls FOR EACH ROW WHEN (NEW.status = 'interrupted')",
        "approval_queue_from_call",
    ),
    "tool_calls_queue_update": (
        "AFTER UPDATE ON tool_calls FOR EACH ROW "
        "WHEN (OLD.status = 'interrupted' OR NEW.status = 'interrupted')",
        "approval_queue_from_call",
    ),
    "turns_queue_update": (
        "AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW "
        f"WHEN ({_PAUSED_CHANGED.format(same='IS NOT DISTINCT FROM')})",
        "approval_queue_from_turn",
    ),
    "turns_queue_insert": (
        "AFTER INSERT ON turns FOR EACH ROW WHEN (NEW.seq > 1)",
        "approval_queue_supersede",
    ),
}

# -- SQLite: the same rules as trigger bodies (no procedural code; WHERE clauses instead of IF) -

_SQLITE_ENTRY_OF_CALL = _ENTRY_OF_CALL.replace(
    "WHERE t.id = NEW.turn_id", "WHERE NEW.status = 'interrupted' AND t.id = NEW.turn_id"
)

SQLITE_TRIGGERS = {
    "tool_calls_queue_insert": f"""
        AFTER INSERT ON tool_calls FOR EACH ROW WHEN NEW.status = 'interrupted'
        BEGIN{_ENTRY_OF_CALL}
        END""",
    "tool_calls_queue_update": f"""
        AFTER UPDATE ON tool_calls FOR EACH ROW
        WHEN OLD.status = 'interrupted' OR NEW.status = 'interrupted'
        BEGIN
        DELETE FROM approval_queue
        WHERE turn_id = OLD.turn_id AND round = OLD.round AND ref = OLD.ref;{_SQLITE_ENTRY_OF_CALL}
        END""",
    "turns_queue_update": f"""
        AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW
        WHEN {_PAUSED_CHANGED.format(same="IS")}
        BEGIN
        DELETE FROM approval_queue WHERE turn_id = OLD.id;{_ENTRIES_OF_TURN}
          AND NEW.status = 'completed' AND NEW.finish_reason = 'interrupted';
        END""",
    "turns_queue_insert": """
        AFTER INSERT ON turns FOR EACH ROW WHEN NEW.seq > 1
        BEGIN
        DELETE FROM approval_queue
        WHERE session_id = NEW.session_id
          AND turn_id IN (
              SELECT id FROM turns WHERE session_id = NEW.session_id AND seq < NEW.seq);
        END""",
}


def _age(dialect: str) -> str:
    if dialect == "postgresql":
        return "EXTRACT(EPOCH FROM now() - {col})"
    return "(julianday('now') - julianday({col})) * 86400.0"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "approval_queue",
        sa.Column("turn_id", sa.Text(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False, comment="The turn's session (copied)."),
        sa.Column("agent", sa.Text(), nullable=False, comment="The turn's agent (copied)."),
        sa.Column("name", sa.Text(), nullable=False, comment="The interrupt's name."),
        sa.Column("input", JSON, nullable=True, comment="What the approver sees."),
        sa.Column("interrupt", JSON, nullable=True, comment="The interrupt's metadata."),
        sa.Column("deadline", TIMESTAMP, nullable=True),
        sa.Column(
            "decided_at",
            TIMESTAMP,
            nullable=True,
            comment="Set by an inbox decision (the inbox hides decided entries).",
        ),
        sa.Column("created_at", TIMESTAMP, nullable=False, comment="When the call was journaled."),
        sa.ForeignKeyConstraint(
            ["turn_id", "round", "ref"],
            ["tool_calls.turn_id", "tool_calls.round", "tool_calls.ref"],
            name=op.f("fk_approval_queue_turn_id_tool_calls"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "round", "ref", name=op.f("pk_approval_queue")),
        comment=(
            "The open approvals (the rows of the view open_approvals), kept by triggers on "
            "tool_calls and turns."
        ),
    )
    op.create_index(
        "ix_approval_queue_created_at",
        "approval_queue",
        ["created_at", "turn_id", "ref"],
        unique=False,
    )
    op.create_index("ix_approval_queue_session_id", "approval_queue", ["session_id"], unique=False)
    op.execute(BACKFILL)
    if dialect == "postgresql":
        for name, body in PG_FUNCTIONS.items():
            op.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $${body}\n$$")
        for name, (when, function) in PG_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {when} EXECUTE FUNCTION {function}()")
    else:
        for name, body in SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")
    op.execute("DROP VIEW open_approvals")
    age = _age(dialect).format(col="q.created_at")
    op.execute(f"CREATE VIEW open_approvals AS {NEW_VIEW.format(age=age)}")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW open_approvals")
    age = _age(dialect).format(col="c.created_at")
    op.execute(f"CREATE VIEW open_approvals AS {OLD_VIEW.format(age=age)}")
    for name in PG_TRIGGERS:
        table = "tool_calls" if name.startswith("tool_calls") else "turns"
        op.execute(
            f"DROP TRIGGER IF EXISTS {name} ON {table}"
            if dialect == "postgresql"
            else f"DROP TRIGGER IF EXISTS {name}"
        )
    if dialect == "postgresql":
        for name in PG_FUNCTIONS:
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_index("ix_approval_queue_session_id", table_name="approval_queue")
    op.drop_index("ix_approval_queue_created_at", table_name="approval_queue")
    op.drop_table("approval_queue")
