"""A claim writes its own history entries: the per-row trigger ``turns_history_claim`` goes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 01:45:00.000000

Migration 0013 recorded each claim (``claimed``, and ``lease lost`` when it took over the
lease of a worker that died) with a trigger on every UPDATE of ``turns.attempts``, a PL/pgSQL
function call per leased row on PostgreSQL. A claim is the only statement that moves
``attempts``, and it knows everything those entries say: PostgreSQL's claim now inserts them
in the same statement, from the candidates it read and locked, and SQLite's in the claim's
transaction (``stores/turn_claims.py``). Issue 34: triggers do per-row work only where a
statement cannot.

Downgrading restores the trigger (and its function on PostgreSQL) as 0013 created it; code
of this revision running against a downgraded database would then record each claim twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As migration 0013 created them (a migration keeps its own copy).
_ENTRIES = """
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  SELECT NEW.id, NEW.status, 'lease lost', OLD.attempts, OLD.lease_owner,
         'lease of ' || OLD.lease_owner || ' expired (attempt ' || OLD.attempts || ')', NULL,
         COALESCE(OLD.lease_expires_at, NEW.updated_at)
  WHERE OLD.lease_owner IS NOT NULL;
  INSERT INTO turn_events (turn_id, to_status, kind, attempt, actor, note, detail, at)
  VALUES (NEW.id, NEW.status, 'claimed', NEW.attempts, NEW.lease_owner,
          'claimed by ' || NEW.lease_owner || ' (attempt ' || NEW.attempts || ')', NULL,
          NEW.updated_at);"""

PG_FUNCTION = f"""
CREATE FUNCTION turn_history_from_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN{_ENTRIES}
  RETURN NULL;
END
$$"""

PG_TRIGGER = """
CREATE TRIGGER turns_history_claim
AFTER UPDATE OF attempts ON turns FOR EACH ROW WHEN (NEW.attempts > OLD.attempts)
EXECUTE FUNCTION turn_history_from_claim()"""

SQLITE_TRIGGER = f"""
CREATE TRIGGER turns_history_claim
AFTER UPDATE OF attempts ON turns FOR EACH ROW WHEN NEW.attempts > OLD.attempts
BEGIN{_ENTRIES}
END"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER turns_history_claim ON turns")
        op.execute("DROP FUNCTION turn_history_from_claim()")
    else:
        op.execute("DROP TRIGGER turns_history_claim")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    else:
        op.execute(SQLITE_TRIGGER)
