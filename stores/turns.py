"""SQL for the ``turns`` aggregate: creation, claiming, leases and guarded transitions.

Every status change goes through :func:`transition`: one guarded UPDATE (expected status and
lease token in its WHERE clause) plus its ``turn_events`` row, in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.errors import LeaseLostError, StaleTransitionError
from engine.model import ModelUsage
from engine.status import FinishReason, TurnStatus
from engine.store import (
    NewTurn,
    RoundRecord,
    Transition,
    TurnEvent,
    TurnRecord,
)
from engine.store.rules import LeaseState, check_lease, check_transition, transition_changes
from stores.database import record_from_row
from stores.notify import CHANGE_CHANNEL, WORK_CHANNEL
from stores.pg import PgConnections, PgStatement
from stores.schema import ACTIVE, approval_queue, turn_events, turns

__all__ = [
    "active_turn",
    "add_usage",
    "fence",
    "fetch_turn",
    "get_turn",
    "insert_turn",
    "latest_turn",
    "list_events",
    "paused_now",
    "renew",
    "stopped_at_approvals",
    "transition",
]


def record(row: sa.Row[tuple[object, ...]] | Mapping[str, Any]) -> TurnRecord:
    """A :class:`TurnRecord` from a ``turns`` row (SQLAlchemy's, or psycopg's as a dict)."""
    return record_from_row(TurnRecord, row)


def stopped_at_approvals(table: sa.Table = turns) -> sa.ColumnElement[bool]:
    """A turn of ``table`` (``turns`` or an alias of it) stopped at approvals: paused now, or
    paused once and continued since (a resumed turn keeps its status)."""
    return sa.and_(
        table.c.status == TurnStatus.COMPLETED.value,
        table.c.finish_reason == FinishReason.INTERRUPTED.value,
    )


def paused_now() -> sa.ColumnElement[bool]:
    """The turn is paused at approvals now: stopped at them and its session's latest.
    ``approval_queue`` holds exactly those turns' calls, so reading it finds them without
    visiting every turn ever paused and since resumed."""
    return sa.and_(stopped_at_approvals(), turns.c.id.in_(sa.select(approval_queue.c.turn_id)))


#: Built once: the most frequent read (waiters, status checks) skips statement construction.
_BY_ID = sa.select(turns).where(turns.c.id == sa.bindparam("turn_id"))


def get_turn(connection: Connection, turn_id: str) -> TurnRecord | None:
    """The turn, or ``None``."""
    row = connection.execute(_BY_ID, {"turn_id": turn_id}).first()
    return record(row) if row else None


async def fetch_turn(pg: PgConnections, turn_id: str) -> TurnRecord | None:
    """:func:`get_turn` on psycopg's async connections (PostgreSQL): waiters poll it."""
    rows = await pg.fetch(_PG_BY_ID, {"turn_id": turn_id})
    return record(rows[0]) if rows else None


_PG_BY_ID = PgStatement(_BY_ID)


def latest_turn(connection: Connection, session_id: str) -> TurnRecord | None:
    """The session's newest turn (highest ``seq``; uses the (session_id, seq) unique index)."""
    row = connection.execute(
        sa.select(turns)
        .where(turns.c.session_id == session_id)
        .order_by(turns.c.seq.desc())
        .limit(1)
    ).first()
    return record(row) if row else None


def lock_turn(connection: Connection, turn_id: str) -> TurnRecord | None:
    """The turn, its row locked until the transaction ends (``None``: unknown)."""
    row = connection.execute(_LOCK_BY_ID, {"turn_id": turn_id}).first()
    return record(row) if row else None


def latest_turn_id(connection: Connection, session_id: str) -> str | None:
    """The id of the session's newest turn (``None``: no turn yet)."""
    return connection.execute(_LATEST_ID, {"session_id": session_id}).scalar()


_LATEST_ID = (
    sa.select(turns.c.id)
    .where(turns.c.session_id == sa.bindparam("session_id"))
    .order_by(turns.c.seq.desc())
    .limit(1)
)


def active_turn(connection: Connection, session_id: str) -> tuple[str, TurnStatus] | None:
    """The id and status of the session's pending or aborting turn, if any (only what the
    "session busy" error names: no full record is built)."""
    row = connection.execute(_ACTIVE, {"session_id": session_id}).first()
    return (row[0], TurnStatus(row[1])) if row else None


_ACTIVE = sa.select(turns.c.id, turns.c.status).where(
    turns.c.session_id == sa.bindparam("session_id"), turns.c.status.in_(ACTIVE)
)


def _event(
    connection: Connection,
    turn_id: str,
    old: TurnStatus | None,
    new: TurnStatus,
    attempt: int,
    now: datetime,
    note: str | None,
    notify: tuple[str, ...] = (),
    actor: str | None = None,
) -> None:
    """Record a transition in ``turn_events`` (``actor``: the worker whose lease it ends, if
    any) and send the ``notify`` channels its turn id.

    On PostgreSQL the notifications ride on the INSERT (``RETURNING pg_notify(…)``): one
    round trip less per transition. Like any NOTIFY they are delivered only if the
    transaction commits. SQLite has no notifications (its waiters poll).
    """
    postgres = connection.dialect.name == "postgresql"
    connection.execute(
        _INSERT_EVENT_NOTIFY[len(notify)] if postgres and notify else _INSERT_EVENT,
        {
            **{f"channel_{i}": channel for i, channel in enumerate(notify)},
            "turn_id": turn_id,
            "from_status": old.value if old else None,
            "to_status": new.value,
            "attempt": attempt,
            "note": note,
            "at": now,
            "actor": actor,
        },
    )


# Hot statements are built once, with bound parameters: building a statement (and its
# cache key, which walks every value) per call cost more CPU than the database spent on it.
_INSERT_EVENT = sa.insert(turn_events)
_INSERT_EVENT_NOTIFY = {
    count: _INSERT_EVENT.returning(
        *(
            sa.func.pg_notify(sa.bindparam(f"channel_{i}", type_=sa.Text), turn_events.c.turn_id)
            for i in range(count)
        )
    )
    for count in (1, 2)
}


def insert_turn(connection: Connection, turn: NewTurn, now: datetime) -> TurnRecord:
    """Insert a pending turn with the next ``seq`` of its session (the session row is locked,
    so the ``max(seq) + 1`` computed inside the INSERT cannot race another creator)."""
    values: dict[str, Any] = {
        "id": turn.id,
        "session_id": turn.session_id,
        "agent": turn.agent,
        "parent_id": turn.parent_id,
        "status": TurnStatus.PENDING.value,
        "input": turn.input.model_dump(mode="json", by_alias=True, exclude_unset=True),
        "history_length": turn.history_length,
        "attempts": 0,
        "max_attempts": turn.max_attempts,
        "lease_token": 0,
        "run_after": now,
        "created_at": now,
        "updated_at": now,
        "trace_context": turn.trace_context,
        "custom": turn.custom,
        "artifacts": turn.artifacts,
        "app_version": turn.app_version,
        "definition_fingerprint": turn.definition_fingerprint,
    }
    row = connection.execute(_INSERT_TURN, values).one()
    _event(connection, turn.id, None, TurnStatus.PENDING, 0, now, turn.note, notify=(WORK_CHANNEL,))
    return record(row)


def _insert_turn_statement() -> sa.TextualSelect:
    # Text, because the seq subquery must read the session_id parameter of the row being
    # inserted, which a Core insert() cannot bind twice; typed parameters and result
    # columns keep the JSON and timestamp processing of the table's types.
    unset = (
        "seq",
        "finish_reason",
        "error",
        "lease_owner",
        "lease_expires_at",
        "settled_at",
        "input_tokens",
        "output_tokens",
    )
    columns = [c.name for c in turns.columns if c.name not in unset]
    sql = (
        f"INSERT INTO turns (seq, {', '.join(columns)}) VALUES ("
        "(SELECT coalesce(max(seq), 0) + 1 FROM turns WHERE session_id = :session_id), "
        f"{', '.join(':' + c for c in columns)}) "
        f"RETURNING {', '.join(c.name for c in turns.columns)}"
    )
    return (
        sa.text(sql)
        .bindparams(*(sa.bindparam(c, type_=turns.c[c].type) for c in columns))
        .columns(*turns.columns)
    )


_INSERT_TURN = _insert_turn_statement()


def fence(connection: Connection, turn_id: str, lease_token: int) -> str | None:
    """Check (and share-lock) that ``lease_token`` still holds the running turn, and return
    its lease owner (the worker the caller's writes are by).

    The share lock makes a competing claim wait until this write commits, so a write can
    never land after the turn changed hands.
    """
    # Only the columns the check needs: a fence runs before every journal write, and
    # building a full record (re-validating the turn's input) would cost more than the read.
    row = connection.execute(_FENCE, {"turn_id": turn_id}).first()
    found = None if row is None else LeaseState(TurnStatus(row[0]), row[1])
    check_lease(turn_id, lease_token, found)
    assert row is not None  # check_lease raised otherwise
    owner: str | None = row[2]
    return owner


_FENCE = (
    sa.select(turns.c.status, turns.c.lease_token, turns.c.lease_owner)
    .where(turns.c.id == sa.bindparam("turn_id"))
    .with_for_update(read=True)
)


def renew(
    connection: Connection, turn_id: str, lease_token: int, lease_seconds: float, now: datetime
) -> TurnRecord:
    """Extend a lease held with ``lease_token`` (a fenced UPDATE)."""
    row = connection.execute(
        sa.update(turns)
        .where(
            turns.c.id == turn_id,
            turns.c.lease_token == lease_token,
            turns.c.status.in_(ACTIVE),
        )
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now)
        .returning(turns)
    ).first()
    if row is None:
        fence(connection, turn_id, lease_token)  # raises the precise error
        raise LeaseLostError(turn_id, f"Lease {lease_token} on turn {turn_id} was lost.")
    return record(row)


def transition(
    connection: Connection, turn_id: str, change: Transition, now: datetime
) -> TurnRecord:
    """The one guarded status change (see :class:`engine.store.Transition`); the round,
    journal rows and usage that ``change`` may carry are the caller's to write."""
    return transition_from(connection, turn_id, change, now)[1]


def transition_from(
    connection: Connection, turn_id: str, change: Transition, now: datetime
) -> tuple[TurnRecord, TurnRecord]:
    """:func:`transition`, returning the turn as it was found (under its row lock) and as
    moved: the caller writing the change's journal rows names the lease owner it found."""
    # The row lock makes the check and the guarded UPDATE below one atomic step.
    row = connection.execute(_LOCK_BY_ID, {"turn_id": turn_id}).first()
    current = check_transition(record(row) if row else None, turn_id, change)
    changes = transition_changes(change, current.lease_token, now)
    values: dict[str, Any] = {
        key: value.value if isinstance(value, StrEnum) else value for key, value in changes.items()
    }
    # A cleared error is SQL NULL (the statement sets it), not a JSON null parameter.
    clear_error = "error" in values and values["error"] is None
    if clear_error:
        del values["error"]
    elif "error" in values:
        values["error"] = values["error"].model_dump(mode="json")
    guard: dict[str, Any] = {"m_id": turn_id, "m_status": current.status.value}
    fenced = change.lease_token is not None
    if fenced:
        guard["m_token"] = change.lease_token
    statement = _MOVES[fenced, clear_error]
    moved = connection.execute(statement, {**guard, **values}).first()
    if moved is None:  # cannot happen under the row lock; kept as the guard's contract
        raise StaleTransitionError(turn_id, f"Turn {turn_id} changed concurrently.")
    new = change.new
    channels = (CHANGE_CHANNEL, WORK_CHANNEL) if new is TurnStatus.PENDING else (CHANGE_CHANNEL,)
    _event(
        connection,
        turn_id,
        current.status,
        new,
        current.attempts,
        now,
        change.note,
        channels,
        # Only the lease holder's own transition is its act (an abort request is not).
        actor=current.lease_owner if change.lease_token is not None else None,
    )
    return current, record(moved)


_LOCK_BY_ID = _BY_ID.with_for_update()


def _move_statement(*, fenced: bool, clear_error: bool) -> sa.Update:
    """The guarded UPDATE of :func:`transition`, built once per shape: the changed columns
    come as parameters (the SET clause follows their names), the guard as ``m_id``,
    ``m_status`` and, when fenced, ``m_token``."""
    guard = [turns.c.id == sa.bindparam("m_id"), turns.c.status == sa.bindparam("m_status")]
    if fenced:
        guard.append(turns.c.lease_token == sa.bindparam("m_token"))
    statement = sa.update(turns).where(*guard).returning(turns)
    return statement.values(error=sa.null()) if clear_error else statement


_MOVES = {
    (fenced, clear): _move_statement(fenced=fenced, clear_error=clear)
    for fenced in (False, True)
    for clear in (False, True)
}


def list_events(connection: Connection, turn_id: str) -> list[TurnEvent]:
    """The turn's transitions, oldest first (its other history entries left out)."""
    rows = connection.execute(
        sa.select(turn_events)
        .where(turn_events.c.turn_id == turn_id, turn_events.c.kind == "status")
        .order_by(turn_events.c.id)
    ).all()
    return [record_from_row(TurnEvent, r) for r in rows]


def set_state(connection: Connection, turn_id: str, rounds: Sequence[RoundRecord | None]) -> None:
    """Write the session state a committed round of ``rounds`` carries onto the turn, inside
    the transaction that writes the round (the last such round's, when several do)."""
    states = [r.state for r in rounds if r is not None and r.committed and r.state is not None]
    if states:
        connection.execute(
            sa.update(turns)
            .where(turns.c.id == turn_id)
            .values(custom=states[-1].custom, artifacts=states[-1].artifacts_wire())
        )


def add_usage(connection: Connection, turn_id: str, usage: ModelUsage) -> None:
    """Add one model call's token counts to the turn's totals, inside the transaction of a
    fenced write (whose fence rolls it back if the lease was lost).

    Only reported counts are added, so a turn whose model reports nothing keeps NULL.
    """
    values: dict[str, Any] = {}
    for column, count in (
        (turns.c.input_tokens, usage.input_tokens),
        (turns.c.output_tokens, usage.output_tokens),
    ):
        if count is not None:
            values[column.name] = sa.func.coalesce(column, 0) + count
    if values:
        connection.execute(sa.update(turns).where(turns.c.id == turn_id).values(values))
