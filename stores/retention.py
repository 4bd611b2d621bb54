"""SQL for retention: deleting sessions that finished long ago, with everything they hold.

A session is prunable when nothing in it moved since the cutoff, no turn of it is running, and
its latest turn is not paused at an interrupt — an open approval is kept however old it is,
because long-lived approvals are the point. Deletion is batched and takes the sessions' row
locks (``SKIP LOCKED``), so it never waits behind, nor races, a turn being created: creating a
turn locks its session row first.

A batch costs its sessions, not the history (issue 34): it walks ``ix_turns_created_at`` from
the oldest turn, keeps each session's latest turn (the session idle longest comes first),
looks at that session's turns through ``(session_id, seq)``, and deletes their rows by key.
On every batch it still steps over the old sessions it keeps (paused at an approval) and the
turns older than the cutoff of sessions active since.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.status import TurnStatus
from stores.schema import messages, sessions, tool_calls, turn_events, turns
from stores.turns import stopped_at_approvals

__all__ = ["prune_sessions"]

#: Turn ids per statement: well under SQLite's limit of bound parameters.
_CHUNK = 500


def prune_sessions(connection: Connection, *, settled_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` prunable sessions idle since ``settled_before``; how many went."""
    # The session's other turns, as seen from the walked one.
    others = turns.alias("others")
    latest_seq = (
        sa.select(sa.func.max(others.c.seq))
        .where(others.c.session_id == turns.c.session_id)
        .scalar_subquery()
    )
    # Scalar subqueries, not EXISTS: the planner runs them once per turn the index walk
    # reaches, reading that session's turns by key, where it turned an anti-join over
    # EXISTS into reads of every turn.
    recent_or_running = (
        sa.select(sa.func.count())
        .where(
            others.c.session_id == turns.c.session_id,
            sa.or_(
                others.c.status.in_([TurnStatus.PENDING.value, TurnStatus.ABORTING.value]),
                others.c.updated_at >= settled_before,
            ),
        )
        .scalar_subquery()
    )
    paused = stopped_at_approvals()
    idle_since = (
        sa.select(sessions.c.updated_at)
        .where(sessions.c.id == turns.c.session_id)
        .scalar_subquery()
    )
    # Each session once, at its latest turn, whose creation is the session's last activity
    # (it sets ``sessions.updated_at``): the oldest first, in the order of
    # ix_turns_created_at, so a batch reads the index from its start and stops once it
    # holds ``limit`` sessions to delete. No index on ``sessions.updated_at`` is needed,
    # which keeps the session's update at each new turn a HOT update.
    walk = (
        sa.select(turns.c.session_id)
        .where(
            turns.c.created_at < settled_before,
            turns.c.seq == latest_seq,
            idle_since < settled_before,
            recent_or_running == 0,
            paused.is_not(True),
        )
        .order_by(turns.c.created_at, turns.c.id)
        .limit(limit)
    )
    if connection.dialect.name == "postgresql":
        # The planner cannot tell how soon the walk finds a batch, so it costs the whole
        # index and would JIT-compile a statement that runs in milliseconds, for longer.
        connection.exec_driver_sql("SET LOCAL jit = off")
    walked = list(connection.execute(walk).scalars())
    if not walked:
        return 0
    # The walked sessions as values, not the walk as a subquery or a join: costed as a walk
    # of the whole index, either made the planner read all of ``sessions`` for them.
    candidates = sa.select(sessions.c.id).where(
        sessions.c.id.in_(walked), sessions.c.updated_at < settled_before
    )
    if connection.dialect.name == "postgresql":
        # Lock the chosen sessions: a concurrent create_turn (which locks its session row
        # first) waits for us instead of adding a turn to a session being deleted; sessions
        # somebody else holds are skipped until the next run. A turn created since the walk
        # moved its session's updated_at, which the lock reads again.
        candidates = candidates.with_for_update(skip_locked=True)
    ids = [row[0] for row in connection.execute(candidates)]
    if not ids:
        return 0
    # The doomed turns' ids as values, not a subquery: the planner then knows how few they
    # are and deletes by key, where a misestimated subquery made it hash-join whole tables.
    doomed = list(
        connection.execute(sa.select(turns.c.id).where(turns.c.session_id.in_(ids))).scalars()
    )
    for start in range(0, len(doomed), _CHUNK):
        chunk = doomed[start : start + _CHUNK]
        # A branch in another session outlives its parent: it holds its own copy of the
        # conversation, and its parent reference goes with the parent.
        connection.execute(
            sa.update(turns)
            .where(turns.c.parent_id.in_(chunk), turns.c.session_id.not_in(ids))
            .values(parent_id=None)
        )
        # Children first, explicitly: the schema cascades on PostgreSQL and on SQLite with
        # foreign keys on, but an operator's connection to SQLite may have them off.
        for child in (messages, tool_calls, turn_events):
            connection.execute(sa.delete(child).where(child.c.turn_id.in_(chunk)))
    # One statement for all turns of a session: the parent_id references among them are
    # checked at the end of the statement, when none is left.
    connection.execute(sa.delete(turns).where(turns.c.session_id.in_(ids)))
    connection.execute(sa.delete(sessions).where(sessions.c.id.in_(ids)))
    return len(ids)
