"""``SqlSessionStore``: the durable SessionStore on PostgreSQL (psycopg 3) or SQLite.

Each method is one short transaction, run by SQLAlchemy in a worker thread — except, on
PostgreSQL, the common path of a turn (create, claim, read, save a round, settle): each of
those is one statement, run on psycopg's async connections in the event loop
(``stores/pg.py``), with the transaction as the fallback that raises the precise error.
SQL lives in the aggregate modules (``turns``, ``turn_claims``, ``turn_creation``,
``fenced``, ``snapshots``, ``sessions``, ``messages``, ``tool_calls``). Wake-ups come from
LISTEN/NOTIFY on PostgreSQL and from polling on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL

from engine.errors import (
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    StaleTransitionError,
)
from engine.model import ModelUsage
from engine.parts import Message
from engine.relay import ChunkBroker, ChunkSubscription
from engine.status import TurnStatus
from engine.store import (
    ApprovalQuery,
    InterruptAnswer,
    NewTurn,
    PendingApproval,
    RoundRecord,
    SessionRecord,
    StoredSnapshot,
    ToolCallRecord,
    Transition,
    TurnProgress,
    TurnRecord,
)
from engine.store_rules import abort_target, check_answers, claim_after
from stores import approvals as approval_sql
from stores import fenced as fenced_sql
from stores import messages as message_sql
from stores import retention as retention_sql
from stores import sessions as session_sql
from stores import snapshots as snapshot_sql
from stores import tool_calls as call_sql
from stores import turn_claims as claim_sql
from stores import turn_creation as creation_sql
from stores import turns as turn_sql
from stores import views
from stores.database import Database, default_url
from stores.notify import CHUNK_CHANNEL, Listener, chunk_payloads, notify
from stores.pg import PLANNER_SETTINGS, PgConnections, StatementRefused

__all__ = ["PLANNER_ENV", "SqlSessionStore"]

#: ``off`` leaves the PostgreSQL hot path's connections PostgreSQL's own planner settings.
PLANNER_ENV = "TURNSTILE_PG_PLANNER"

logger = logging.getLogger("turnstile.store")

T = TypeVar("T")

#: How many claimed turns' progress a store keeps for the worker about to run them.
MAX_KEPT_PROGRESS = 1_000


def _now() -> datetime:
    return datetime.now(UTC)


def _round_and_transition_times() -> tuple[datetime, datetime]:
    """When a settle's round is saved, and when its transition happens: the round is stamped
    just before the transition, as if saved by save_round first, so a turn's timeline keeps
    ending with its settling transition."""
    saved_at = _now()
    return saved_at, max(_now(), saved_at + timedelta(microseconds=1))


class SqlSessionStore:
    """A :class:`~engine.store.SessionStore` in PostgreSQL or SQLite.

    ``url`` defaults to ``TURNSTILE_DATABASE_URL``, else ``sqlite:///.turnstile/turnstile.db``.
    The schema must exist: run ``turnstile migrate`` (or ``alembic upgrade head``).
    ``poll_interval`` bounds how long a missed notification can delay a waiter (SQLite has
    no notifications, so waiters poll at this interval there). ``planner_settings``
    (PostgreSQL): server settings for the hot path's connections; by default
    :data:`stores.pg.PLANNER_SETTINGS`, ``{}`` (or ``TURNSTILE_PG_PLANNER=off``) for none.
    """

    durable = True

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        pool_size: int = 10,
        poll_interval: float = 0.05,
        planner_settings: Mapping[str, str] | None = None,
    ) -> None:
        if planner_settings is None:
            planner_settings = {} if os.environ.get(PLANNER_ENV) == "off" else PLANNER_SETTINGS
        self.db = Database(
            url or default_url(), pool_size=pool_size, planner_settings=planner_settings
        )
        self.poll_interval = poll_interval
        self._chunks = ChunkBroker()
        self._listener = Listener(self.db.url, self._chunks) if self.db.is_postgres else None
        # The progress of turns this store claimed and has not yet run (PostgreSQL).
        self._claimed_progress: dict[str, TurnProgress] = {}

    @property
    def url(self) -> URL:
        """The database URL."""
        return self.db.url

    def __repr__(self) -> str:
        return f"SqlSessionStore({self.db.url.render_as_string(hide_password=True)!r})"

    # -- turns -------------------------------------------------------------------------

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.create_turn`."""
        check_answers(turn, answers)
        try:
            # A caller acting for a principal takes the transaction: its owner check reads
            # the session.
            if self.db.is_postgres and turn.owner is None:
                try:
                    created = await creation_sql.create_turn_in_one_statement(
                        self._pg, turn, answers, _now()
                    )
                except StatementRefused as exc:
                    # A constraint refused it (nothing was written): the transaction below
                    # raises the precise error, or succeeds if the conflict is gone.
                    logger.debug("turn %s: one-statement creation refused (%s)", turn.id, exc)
                    created = None
                if created is not None:
                    return created
            return await self._write(lambda c: creation_sql.create_turn(c, turn, answers, _now()))
        except StatementRefused as exc:
            # The partial unique index is the backstop for "one running turn per session".
            if exc.constraint == "ux_turns_one_active_per_session":
                raise SessionBusyError(
                    f"Session {turn.session_id} already has a running turn."
                ) from exc
            if exc.constraint == "pk_turns" or exc.sqlite_error == "SQLITE_CONSTRAINT_PRIMARYKEY":
                # SQLite names no constraint; the only key a creation can repeat is the turn's.
                raise InvalidArgumentError(f"Turn {turn.id} already exists.") from exc
            raise

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """See :meth:`engine.store.SessionStore.get_session`."""
        return await self._read(lambda c: session_sql.get_session(c, session_id))

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.get_turn`."""
        if self.db.is_postgres:
            return await turn_sql.fetch_turn(self._pg, turn_id)
        return await self._read(lambda c: turn_sql.get_turn(c, turn_id))

    async def latest_turn(self, session_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.latest_turn`."""
        return await self._read(lambda c: turn_sql.latest_turn(c, session_id))

    async def claim_turn(self, turn_id: str, *, owner: str, lease_seconds: float) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.claim_turn`."""
        claimed = await self._claim(
            owner=owner, lease_seconds=lease_seconds, limit=1, turn_ids=[turn_id]
        )
        if not claimed:
            raise StaleTransitionError(turn_id, f"Turn {turn_id} is not claimable.")
        return claimed[0]

    async def claim_next(
        self,
        *,
        owner: str,
        lease_seconds: float,
        limit: int = 1,
        agents: Collection[str] | None = None,
        among: Collection[str] | None = None,
    ) -> list[TurnRecord]:
        """See :meth:`engine.store.SessionStore.claim_next`."""
        if limit < 1:
            raise ValueError("limit must be at least 1.")
        if among is not None and not among:
            return []
        return await self._claim(
            owner=owner, lease_seconds=lease_seconds, limit=limit, agents=agents, turn_ids=among
        )

    async def _claim(
        self,
        *,
        owner: str,
        lease_seconds: float,
        limit: int,
        agents: Collection[str] | None = None,
        turn_ids: Collection[str] | None = None,
    ) -> list[TurnRecord]:
        def request() -> claim_sql.ClaimRequest:
            return claim_sql.ClaimRequest(
                owner=owner,
                lease_seconds=lease_seconds,
                now=_now(),
                limit=limit,
                agents=agents,
                turn_ids=turn_ids,
            )

        if not self.db.is_postgres:
            return await self._write(lambda c: claim_sql.claim(c, request()))
        # PostgreSQL: one autocommit statement (the claim is on every turn's pickup path).
        checked = await claim_sql.claim_checking_abandoned(self._pg, request())
        return await self._claimed(checked, limit)

    async def _claimed(self, checked: claim_sql.CheckedClaim, limit: int) -> list[TurnRecord]:
        # The rare recovery of an abandoned abort follows in its own transaction.
        self._keep_progress(checked.progress)
        if checked.abandoned:
            await self._write(lambda c: claim_sql.settle_abandoned(c, _now(), limit))
        return checked.turns

    def _keep_progress(self, progress: dict[str, TurnProgress]) -> None:
        # Kept for the runner's read_progress right after the claim. A turn claimed but never
        # run (handed back at shutdown) leaves its entry behind: bounded, oldest dropped.
        self._claimed_progress.update(progress)
        while len(self._claimed_progress) > MAX_KEPT_PROGRESS:
            del self._claimed_progress[next(iter(self._claimed_progress))]

    async def renew_lease(
        self, turn_id: str, *, lease_token: int, lease_seconds: float
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.renew_lease`."""
        return await self._write(
            lambda c: turn_sql.renew(c, turn_id, lease_token, lease_seconds, _now())
        )

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.transition`."""
        self._claimed_progress.pop(turn_id, None)  # what the claim read is old now
        then_claim = change.then_claim

        def move(connection: sa.Connection) -> TurnRecord:
            saved_at, now = _round_and_transition_times()
            if change.usage is not None:
                # First, so the row the transition returns carries the new totals; a refused
                # transition rolls it back with everything else.
                turn_sql.add_usage(connection, turn_id, change.usage)
            # The transition locks the turn's row and checks the lease token first, so the
            # round below is written only by the lease holder, as save_round's fence ensures.
            moved = turn_sql.transition(connection, turn_id, change, now)
            if change.round is not None:
                message_sql.save_round(connection, turn_id, change.round, saved_at)
            call_sql.upsert_calls(connection, turn_id, change.calls, saved_at)
            return moved

        if self.db.is_postgres and fenced_sql.transition_applies(change):
            # The lease holder's transitions (every settle) as one round trip, with the
            # follow-on claim if any; refused (nothing written), the transaction below
            # raises the precise error.
            saved_at, now = _round_and_transition_times()
            moved, checked = await fenced_sql.transition_fenced(
                self._pg,
                turn_id,
                change,
                now=now,
                saved_at=saved_at,
                claim=(
                    claim_sql.ClaimRequest.of(then_claim, _now())
                    if then_claim is not None and then_claim.wanted
                    else None
                ),
            )
            if checked is not None and then_claim is not None:
                claimed = await self._claimed(checked, then_claim.limit)
                then_claim.claimed, then_claim.ran = claimed, True
            if moved is not None:
                return moved
        moved = await self._write(move)
        if then_claim is not None and not then_claim.ran:
            await claim_after(self, then_claim)
        return moved

    async def request_abort(self, turn_id: str) -> TurnStatus:
        """See :meth:`engine.store.SessionStore.request_abort`."""

        def abort(connection: sa.Connection) -> TurnStatus:
            # Decided on the locked row: a claim or a settle committing meanwhile would
            # otherwise turn "not leased" into "aborted under a worker", or make the guarded
            # move below match nothing.
            current = turn_sql.lock_turn(connection, turn_id)
            now = _now()
            if current is None:
                raise NotFoundError(f"Snapshot {turn_id} not found.")
            target = abort_target(current, now)
            if target is None:
                return current.status
            new, finish_reason = target
            change = Transition(
                expected={TurnStatus.PENDING},
                new=new,
                lease_token=None,
                finish_reason=finish_reason,
                note="abort requested",
            )
            moved = turn_sql.transition(connection, turn_id, change, now)
            return moved.status

        return await self._write(abort)

    # -- rounds and journal ------------------------------------------------------------

    async def save_round(
        self,
        turn_id: str,
        *,
        lease_token: int,
        round: RoundRecord,
        calls: Sequence[ToolCallRecord] = (),
        usage: ModelUsage | None = None,
        earlier: RoundRecord | None = None,
    ) -> None:
        """See :meth:`engine.store.SessionStore.save_round`."""

        def save(connection: sa.Connection) -> None:
            now = _now()
            if usage is not None:
                # First, so the turn row is locked exclusively before the fence's share lock:
                # upgrading share to exclusive could deadlock with a concurrent heartbeat.
                turn_sql.add_usage(connection, turn_id, usage)
            turn_sql.fence(connection, turn_id, lease_token)
            if earlier is not None:
                message_sql.save_round(connection, turn_id, earlier, now)
            message_sql.save_round(connection, turn_id, round, now)
            call_sql.upsert_calls(connection, turn_id, calls, now)

        await self._save_fenced(
            turn_id, lease_token, save, round=round, calls=calls, usage=usage, earlier=earlier
        )

    async def record_call(self, turn_id: str, *, lease_token: int, call: ToolCallRecord) -> None:
        """See :meth:`engine.store.SessionStore.record_call`."""

        def write(connection: sa.Connection) -> None:
            turn_sql.fence(connection, turn_id, lease_token)
            call_sql.upsert_calls(connection, turn_id, [call], _now())

        await self._save_fenced(turn_id, lease_token, write, round=None, calls=[call], usage=None)

    async def _save_fenced(
        self,
        turn_id: str,
        lease_token: int,
        reference: Callable[[sa.Connection], None],
        *,
        round: RoundRecord | None,
        calls: Sequence[ToolCallRecord],
        usage: ModelUsage | None,
        earlier: RoundRecord | None = None,
    ) -> None:
        """A lease holder's journal write: on PostgreSQL one statement (one round trip);
        when its fence refuses (nothing written) or on SQLite, the ``reference`` transaction,
        which raises the precise error."""
        self._claimed_progress.pop(turn_id, None)  # what the claim read is old now
        if self.db.is_postgres and await fenced_sql.save_fenced(
            self._pg,
            turn_id,
            lease_token,
            round=round,
            calls=calls,
            usage=usage,
            now=_now(),
            earlier=earlier,
        ):
            return
        await self._write(reference)

    async def load_rounds(self, turn_id: str) -> list[RoundRecord]:
        """See :meth:`engine.store.SessionStore.load_rounds`."""
        return await self._read(lambda c: message_sql.load_rounds(c, turn_id))

    async def list_calls(self, turn_id: str) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_calls`."""
        return await self._read(lambda c: call_sql.list_calls(c, turn_id))

    async def load_conversation(self, turn_id: str) -> list[Message]:
        """See :meth:`engine.store.SessionStore.load_conversation`."""

        def load(connection: sa.Connection) -> list[Message]:
            conversation = message_sql.load_conversation(connection, turn_id)
            if conversation is None:
                raise NotFoundError(f"Snapshot {turn_id} not found.")
            return conversation

        return await self._read(load)

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """See :meth:`engine.store.SessionStore.read_progress`."""
        if self.db.is_postgres:
            # Read with this store's claim of the turn, unless this store wrote the turn
            # since: the lease that claim took is the only one that can write it.
            kept = self._claimed_progress.pop(turn_id, None)
            if kept is not None:
                return kept
            return await snapshot_sql.read_progress_in_one_statement(self._pg, turn_id)
        return await self._read(lambda c: snapshot_sql.read_progress(c, turn_id))

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """See :meth:`engine.store.SessionStore.read_snapshot`."""
        if self.db.is_postgres:
            return await snapshot_sql.read_snapshot_in_one_statement(self._pg, turn_id)
        return await self._read(lambda c: snapshot_sql.read_snapshot(c, turn_id))

    async def list_expired_interrupts(
        self, *, now: datetime, limit: int = 100, agents: Collection[str] | None = None
    ) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_expired_interrupts`."""
        return await self._read(lambda c: call_sql.list_expired(c, now, limit, agents))

    # -- operator views ----------------------------------------------------------------

    async def open_approvals(self, agent: str | None = None) -> list[views.OpenApproval]:
        """Rows of the ``open_approvals`` view, oldest first."""
        return await self._read(lambda c: views.open_approvals(c, agent))

    async def stuck_turns(self) -> list[views.StuckTurn]:
        """Rows of the ``stuck_turns`` view."""
        return await self._read(views.stuck_turns)

    async def timeline(self, turn_id: str) -> list[views.TimelineEntry]:
        """Rows of the ``turn_timeline`` view for one turn, in order."""
        return await self._read(lambda c: views.timeline(c, turn_id))

    # -- wake-ups ----------------------------------------------------------------------

    async def wait_for_work(self, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_work`."""
        if self._listener is None:
            await asyncio.sleep(min(timeout, self.poll_interval))
        else:
            await self._listener.wait_for_work(timeout)

    def take_work_hints(self) -> list[str] | None:
        """See :meth:`engine.store.SessionStore.take_work_hints`."""
        return None if self._listener is None else self._listener.take_work_hints()

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_change`."""
        if self._listener is None:
            await asyncio.sleep(min(timeout, self.poll_interval))
        else:
            await self._listener.wait_for_change(turn_id, timeout)

    async def list_approvals(self, query: ApprovalQuery) -> list[PendingApproval]:
        """See :meth:`engine.store.SessionStore.list_approvals`."""
        return await self._read(lambda c: approval_sql.list_approvals(c, query))

    async def record_decision(
        self, turn_id: str, round: int, ref: str, *, answer: Any, decided_by: str | None
    ) -> ToolCallRecord:
        """See :meth:`engine.store.SessionStore.record_decision`."""

        return await self._write(
            lambda c: approval_sql.record_decision(
                c, turn_id, round, ref, answer=answer, decided_by=decided_by, now=_now()
            )
        )

    async def prune_sessions(self, *, settled_before: datetime, limit: int = 500) -> int:
        """See :meth:`engine.store.SessionStore.prune_sessions`."""
        return await self._write(
            lambda c: retention_sql.prune_sessions(c, settled_before=settled_before, limit=limit)
        )

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """See :meth:`engine.store.SessionStore.publish_chunk`.

        PostgreSQL: ``NOTIFY`` on ``turnstile_chunk``, so a subscriber in any process gets it
        (every listening process receives it; only subscribers of the turn keep it). SQLite has
        no notifications: only subscribers in this process (e.g. ``turnstile serve --workers``)
        see it.
        """
        if self._listener is None:
            self._chunks.deliver(turn_id, chunk)
            return
        payloads = chunk_payloads(turn_id, chunk)
        if not payloads:
            return

        def send(connection: sa.Connection) -> None:
            for payload in payloads:
                notify(connection, CHUNK_CHANNEL, payload)

        await self._write(send)

    @contextlib.asynccontextmanager
    async def _subscribe(self, turn_id: str) -> AsyncIterator[ChunkSubscription]:
        async with self._chunks.subscribe(turn_id) as subscription:
            if self._listener is not None:
                # Chunks published before our LISTEN is up would be lost: wait for it (briefly;
                # with the database down the turn cannot start either).
                await self._listener.wait_connected(timeout=5.0)
            yield subscription

    def subscribe_chunks(self, turn_id: str) -> AbstractAsyncContextManager[ChunkSubscription]:
        """See :meth:`engine.store.SessionStore.subscribe_chunks`."""
        return self._subscribe(turn_id)

    @contextlib.asynccontextmanager
    async def try_cluster_lock(self, name: str) -> AsyncIterator[bool]:
        """Hold a cluster-wide advisory lock while the block runs, if it is free.

        Yields ``False`` (without waiting) when another process holds it. SQLite has one
        writer at a time anyway and always yields ``True``.
        """
        if not self.db.is_postgres:
            yield True
            return
        async with self.db.advisory_lock(name) as got:
            yield got

    async def close(self) -> None:
        """See :meth:`engine.store.SessionStore.close`."""
        if self._listener is not None:
            await self._listener.close()
        if self.db.pg is not None:
            await self.db.pg.close()
        await asyncio.to_thread(self.db.dispose)

    # -- plumbing ----------------------------------------------------------------------

    @property
    def _pg(self) -> PgConnections:
        """The async psycopg connections of the one-statement forms (PostgreSQL only)."""
        assert self.db.pg is not None, "a one-statement form ran on SQLite"
        return self.db.pg

    async def _read(self, query: Callable[[sa.Connection], T]) -> T:
        def run() -> T:
            with self.db.autocommit() as connection:
                return query(connection)

        return await self.db.run(run)

    async def _write(self, change: Callable[[sa.Connection], T]) -> T:
        def run() -> T:
            with self.db.transaction() as connection:
                return change(connection)

        return await self.db.run(run)
