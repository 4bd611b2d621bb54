"""The triggers that keep ``approval_queue`` exact, as a database migrated to head holds them.

``approval_queue`` (:mod:`stores.schema`) holds one row per ``interrupted`` journal row of a
paused turn (``completed`` / ``interrupted``) that is still its session's latest turn. Nothing
but these triggers writes it, and :mod:`stores.approvals` reads it as the open approvals, so
every write path (the store's upserts, decisions, resumes, expiry, retention, an operator's
``UPDATE``) keeps it exact without a round trip from Python:

* ``tool_calls_queue_insert`` / ``tool_calls_queue_update``: a journal row that is or was
  ``interrupted`` loses its entry, then gets it again if it is interrupted and its turn paused
  and latest (an upsert's ``ON CONFLICT DO UPDATE`` fires the UPDATE trigger on both databases);
* ``turns_queue_update``: a turn that becomes paused adds its interrupted calls, one that stops
  being paused loses its entries (a settle may write the turn before or after its calls);
* ``turns_queue_insert``: a session's new turn removes the entries of its older turns.

Deleting a journal row deletes its entry through the foreign key. Each trigger has a ``WHEN``
clause, so heartbeats, claims and the journal writes of calls that are not interrupted run no
trigger code. PostgreSQL runs a plpgsql function per trigger; SQLite, which has no procedural
code, states the same conditions as ``WHERE`` clauses of the trigger bodies. docs/schema.md
("approval_queue") lists the rules and what they do not track.

Migration 0003 created these and keeps its own copy: a migration is history, so changing a
trigger means a new migration and an edit here (0018 made them copy the turn's ``created_at``,
the order of the paused turns' listing). They are Python strings, like every other
statement in ``stores/``, so they are found and imported the same way with no loader or package
data; ``tests/integration/test_database_objects.py`` checks that a migrated database holds
exactly these.
"""

from __future__ import annotations

from textwrap import indent

__all__ = ["definitions"]


# -- The entries' INSERTs, the same in PostgreSQL's functions and SQLite's trigger bodies -----

_INSERT_ENTRY = """INSERT INTO approval_queue (turn_id, round, ref, session_id, agent, name, input,
                            interrupt, deadline, decided_at, created_at, turn_created_at,
                            turn_app_version)"""


def _add_call(guard: str = "") -> str:
    """The INSERT giving the journal row ``NEW`` its entry when its turn is paused and still its
    session's latest; ``guard`` (ending in ``AND``) is put first in its WHERE clause."""
    return f"""{_INSERT_ENTRY}
SELECT NEW.turn_id, NEW.round, NEW.ref, t.session_id, t.agent, NEW.name, NEW.input,
       NEW.interrupt, NEW.deadline, NEW.decided_at, NEW.created_at, t.created_at,
       t.app_version
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


# The paused turn NEW's interrupted calls as entries, unless a later turn superseded it; each
# user ends the statement (a conflict clause or a further condition).
_ADD_TURN_CALLS = f"""{_INSERT_ENTRY}
SELECT c.turn_id, c.round, c.ref, NEW.session_id, NEW.agent, c.name, c.input,
       c.interrupt, c.deadline, c.decided_at, c.created_at, NEW.created_at,
       NEW.app_version
FROM tool_calls c
WHERE c.turn_id = NEW.id AND c.status = 'interrupted'
  AND NOT EXISTS (
      SELECT 1 FROM turns later
      WHERE later.session_id = NEW.session_id AND later.seq > NEW.seq)"""

# -- PostgreSQL: the functions first, as each trigger names the function it calls -------------

_FROM_CALL = f"""
CREATE FUNCTION approval_queue_from_call() RETURNS trigger LANGUAGE plpgsql AS $$
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
{indent(_add_call(), "    ")}
  END IF;
  RETURN NULL;
END
$$"""

_FROM_TURN = f"""
CREATE FUNCTION approval_queue_from_turn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'completed' AND NEW.finish_reason = 'interrupted' THEN
{indent(_ADD_TURN_CALLS, "    ")}
    ON CONFLICT DO NOTHING;
  ELSE
    DELETE FROM approval_queue WHERE turn_id = OLD.id;
  END IF;
  RETURN NULL;
END
$$"""

_SUPERSEDE = """
CREATE FUNCTION approval_queue_supersede() RETURNS trigger LANGUAGE plpgsql AS $$
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
END
$$"""

_PG_CALL_INSERTED = """
CREATE TRIGGER tool_calls_queue_insert
AFTER INSERT ON tool_calls FOR EACH ROW WHEN (NEW.status = 'interrupted')
EXECUTE FUNCTION approval_queue_from_call()"""

_PG_CALL_UPDATED = """
CREATE TRIGGER tool_calls_queue_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN (OLD.status = 'interrupted' OR NEW.status = 'interrupted')
EXECUTE FUNCTION approval_queue_from_call()"""

# finish_reason may be NULL: null-safe comparisons keep each side TRUE or FALSE, where `=` could
# make the WHEN clause NULL and skip the trigger.
_PG_TURN_UPDATED = """
CREATE TRIGGER turns_queue_update
AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW
WHEN ((NEW.status = 'completed' AND NEW.finish_reason IS NOT DISTINCT FROM 'interrupted')
   <> (OLD.status = 'completed' AND OLD.finish_reason IS NOT DISTINCT FROM 'interrupted'))
EXECUTE FUNCTION approval_queue_from_turn()"""

# A session's first turn has no older turns to supersede.
_PG_TURN_INSERTED = """
CREATE TRIGGER turns_queue_insert
AFTER INSERT ON turns FOR EACH ROW WHEN (NEW.seq > 1)
EXECUTE FUNCTION approval_queue_supersede()"""

_POSTGRESQL = {
    "approval_queue_from_call": _FROM_CALL,
    "approval_queue_from_turn": _FROM_TURN,
    "approval_queue_supersede": _SUPERSEDE,
    "tool_calls_queue_insert": _PG_CALL_INSERTED,
    "tool_calls_queue_update": _PG_CALL_UPDATED,
    "turns_queue_update": _PG_TURN_UPDATED,
    "turns_queue_insert": _PG_TURN_INSERTED,
}

# -- SQLite: the same rules as trigger bodies ---------------------------------------------------

_SQLITE_CALL_INSERTED = f"""
CREATE TRIGGER tool_calls_queue_insert
AFTER INSERT ON tool_calls FOR EACH ROW WHEN NEW.status = 'interrupted'
BEGIN
{indent(_add_call(), "  ")}
END"""

# The entry is always removed; `NEW.status = 'interrupted'` in the WHERE clause stands for the
# IF of PostgreSQL's function around adding it again.
_SQLITE_CALL_UPDATED = f"""
CREATE TRIGGER tool_calls_queue_update
AFTER UPDATE ON tool_calls FOR EACH ROW
WHEN OLD.status = 'interrupted' OR NEW.status = 'interrupted'
BEGIN
  DELETE FROM approval_queue
  WHERE turn_id = OLD.turn_id AND round = OLD.round AND ref = OLD.ref;
{indent(_add_call("NEW.status = 'interrupted' AND "), "  ")}
END"""

# SQLite's `IS` is PostgreSQL's `IS NOT DISTINCT FROM`; the last condition of the INSERT makes
# a turn that stops being paused only lose its entries.
_SQLITE_TURN_UPDATED = f"""
CREATE TRIGGER turns_queue_update
AFTER UPDATE OF status, finish_reason ON turns FOR EACH ROW
WHEN (NEW.status = 'completed' AND NEW.finish_reason IS 'interrupted')
  <> (OLD.status = 'completed' AND OLD.finish_reason IS 'interrupted')
BEGIN
  DELETE FROM approval_queue WHERE turn_id = OLD.id;
{indent(_ADD_TURN_CALLS, "  ")}
    AND NEW.status = 'completed' AND NEW.finish_reason = 'interrupted';
END"""

_SQLITE_TURN_INSERTED = """
CREATE TRIGGER turns_queue_insert
AFTER INSERT ON turns FOR EACH ROW WHEN NEW.seq > 1
BEGIN
  DELETE FROM approval_queue
  WHERE session_id = NEW.session_id
    AND turn_id IN (
        SELECT id FROM turns WHERE session_id = NEW.session_id AND seq < NEW.seq);
END"""

_SQLITE = {
    "tool_calls_queue_insert": _SQLITE_CALL_INSERTED,
    "tool_calls_queue_update": _SQLITE_CALL_UPDATED,
    "turns_queue_update": _SQLITE_TURN_UPDATED,
    "turns_queue_insert": _SQLITE_TURN_INSERTED,
}


# -- A turn's history (docs/schema.md, "turn_events") -----------------------------------------
#
# Every entry is written by the statement that makes the change it records: claims by the claim
# (stores/turn_claims.py), tool calls by the journal's writers (stores.history), since
# migrations 0019 and 0020. The one trigger left keeps the history append-only.

_PG_HISTORY_APPEND_ONLY = """
CREATE FUNCTION turn_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'turn_events is append-only: entry % of turn % cannot be changed',
    OLD.id, OLD.turn_id;
END
$$"""

_PG_APPEND_ONLY_TRIGGER = """
CREATE TRIGGER turn_events_append_only
BEFORE UPDATE ON turn_events FOR EACH ROW
EXECUTE FUNCTION turn_history_append_only()"""

_POSTGRESQL_HISTORY = {
    "turn_history_append_only": _PG_HISTORY_APPEND_ONLY,
    "turn_events_append_only": _PG_APPEND_ONLY_TRIGGER,
}

_SQLITE_HISTORY = {
    "turn_events_append_only": """
CREATE TRIGGER turn_events_append_only
BEFORE UPDATE ON turn_events FOR EACH ROW
BEGIN
  SELECT RAISE(ABORT, 'turn_events is append-only');
END""",
}


def definitions(dialect: str) -> dict[str, str]:
    """The ``CREATE`` statement of each trigger (and, on PostgreSQL, trigger function) that
    keeps ``approval_queue`` exact or writes a turn's history, by name, in an order they can
    be run in.

    ``dialect`` is SQLAlchemy's name for the database: ``"postgresql"`` or ``"sqlite"``.
    """
    if dialect == "postgresql":
        return {**_POSTGRESQL, **_POSTGRESQL_HISTORY}
    if dialect == "sqlite":
        return {**_SQLITE, **_SQLITE_HISTORY}
    raise ValueError(f"no triggers for the dialect {dialect!r}")
