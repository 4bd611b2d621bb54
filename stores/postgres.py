"""``PostgresSessionStore``: the production store, each hot write one statement.

A turn's common path — create, claim, read, save a round, settle — is one statement per step,
run on psycopg's async connections in the event loop (``stores/pg.py``). Each statement
writes only when its rules hold and otherwise reports what it found, from which
:mod:`engine.store.rules` raises the precise typed error. Wake-ups and relayed chunks travel
by LISTEN/NOTIFY, so waiters and subscribers in any process hear them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa

from engine.errors import StaleTransitionError
from engine.status import SETTLED_STATUSES
from engine.store import (
    ClaimedTurn,
    InterruptAnswer,
    NewTurn,
    StoredSnapshot,
    Transition,
    TurnProgress,
    TurnRecord,
)
from engine.store.relay import ChunkSubscription
from engine.store.rules import check_answers, check_transition
from engine.store.signals import ChangeSubscription
from stores import fenced as fenced_sql
from stores import snapshots as snapshot_sql
from stores import turn_claims as claim_sql
from stores import turn_creation as creation_sql
from stores import turns as turn_sql
from stores.chunk_relay import ChunkBatcher
from stores.notify import CHUNK_CHANNEL, Listener
from stores.pg import PLANNER_SETTINGS, PgConnections, PgStatement
from stores.settings import current_settings
from stores.sql import FencedWrite, SqlSessionStore, now_utc, round_and_transition_times

__all__ = ["PLANNER_ENV", "PostgresSessionStore"]

#: ``off`` leaves the hot path's connections PostgreSQL's own planner settings.
PLANNER_ENV = "TURNSTILE_PG_PLANNER"

#: One payload of relayed chunks; a batch runs it once per payload, in one transaction.
_NOTIFY_CHUNKS = PgStatement(
    sa.select(sa.func.pg_notify(sa.literal(CHUNK_CHANNEL), sa.bindparam("payload", type_=sa.Text)))
)


class PostgresSessionStore(SqlSessionStore):
    """The :class:`SqlSessionStore` of a PostgreSQL database (``SqlSessionStore(url)`` makes
    it for a ``postgresql://`` URL)."""

    #: Relayed chunks waiting to be published together (see publish_chunk).
    relay: ChunkBatcher

    def _default_planner_settings(self) -> Mapping[str, str]:
        """:data:`~stores.pg.PLANNER_SETTINGS`, or none under ``TURNSTILE_PG_PLANNER=off``."""
        return PLANNER_SETTINGS if current_settings().pg_planner else {}

    def _start(self) -> None:
        """Keep the hot path's async connections; make the NOTIFY listener and the chunk relay."""
        assert self.db.pg is not None, "a PostgreSQL database has async connections"
        self._pg: PgConnections = self.db.pg
        self._listener = Listener(self.db.url, self._chunks)
        self.relay = ChunkBatcher(self._notify_chunks)
        self._read_back = _ReadBack()

    # -- turns -------------------------------------------------------------------------

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.create_turn`."""
        check_answers(turn, answers)
        await self._keep_definition(turn)
        return await creation_sql.create_turn_in_one_statement(self._pg, turn, answers, now_utc())

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.create_claimed_turn`."""
        check_answers(turn, answers)
        await self._keep_definition(turn)
        return await creation_sql.create_claimed_turn_in_one_round_trip(
            self._pg, turn, answers, now_utc(), owner=owner, lease_seconds=lease_seconds
        )

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.get_turn`."""
        return await turn_sql.fetch_turn(self._pg, turn_id)

    async def _claim(self, request: claim_sql.ClaimRequest) -> list[ClaimedTurn]:
        # One autocommit statement (the claim is on every turn's pickup path).
        checked = await claim_sql.claim_checking_abandoned(self._pg, request)
        return await self._claimed(checked, request.limit)

    async def _claimed(self, checked: claim_sql.CheckedClaim, limit: int) -> list[ClaimedTurn]:
        # The rare recovery of an abandoned abort follows in its own transaction.
        if checked.abandoned:
            await self._write(lambda c: claim_sql.settle_abandoned(c, now_utc(), limit))
        return checked.turns

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.transition`."""
        if self.relay.holds(turn_id):
            # The turn's last chunks commit first, so listeners get them before its change.
            await self.relay.flush(turn_id)
        then_claim = change.then_claim
        saved_at, now = round_and_transition_times()
        # The follow-on claim, if any, rides in the same round trip and transaction; so
        # does the read of a settled turn that a caller of this process waits for.
        reading = (
            self._read_back.expect(turn_id)
            if change.new in SETTLED_STATUSES and self._listener.waited_on_here(turn_id)
            else None
        )
        snapshot = None
        try:
            moved, found, checked, snapshot = await fenced_sql.transition_fenced(
                self._pg,
                turn_id,
                change,
                now=now,
                saved_at=saved_at,
                claim=(
                    claim_sql.ClaimRequest.of(then_claim, now_utc())
                    if then_claim is not None and then_claim.wanted
                    else None
                ),
                read_back=reading is not None,
            )
        finally:
            if reading is not None:
                reading.done(snapshot)
        if checked is not None and then_claim is not None:
            claimed = await self._claimed(checked, then_claim.limit)
            then_claim.claimed, then_claim.ran = claimed, True
        if moved is None:
            check_transition(found, turn_id, change)
            # `found` is the row as locked, so the guard fails only as the rules say.
            raise StaleTransitionError(turn_id, f"Turn {turn_id} changed concurrently.")
        self._listener.changed_here(turn_id)
        return moved

    # -- rounds and journal ------------------------------------------------------------

    async def _save_fenced(self, write: FencedWrite) -> None:
        await fenced_sql.save_fenced(
            self._pg,
            write.turn_id,
            write.lease_token,
            round=write.round,
            calls=write.calls,
            usage=write.usage,
            now=now_utc(),
            earlier=write.earlier,
        )

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """See :meth:`engine.store.SessionStore.read_progress`."""
        return await snapshot_sql.read_progress_in_one_statement(self._pg, turn_id)

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """See :meth:`engine.store.SessionStore.read_snapshot`. The first read of a turn
        this process just settled, while a caller here waited for it, is answered with what
        the settle read in its own transaction."""
        kept = await self._read_back.take(turn_id)
        if kept is not None:
            return kept
        return await snapshot_sql.read_snapshot_in_one_statement(self._pg, turn_id)

    # -- wake-ups and relay: LISTEN/NOTIFY ----------------------------------------------

    async def wait_for_work(self, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_work`."""
        await self._listener.wait_for_work(timeout)

    def take_work_hints(self) -> list[str] | None:
        """See :meth:`engine.store.SessionStore.take_work_hints`."""
        return self._listener.take_work_hints()

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_change`."""
        await self._listener.wait_for_change(turn_id, timeout)

    #: Every process's changes arrive by NOTIFY (see :class:`engine.store.ChangeFeed`).
    live_changes = True

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """See :meth:`engine.store.ChangeFeed.watch_changes`."""
        return self._listener.watch_changes()

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """See :meth:`engine.store.SessionStore.publish_chunk`.

        Batched: the chunk waits in :attr:`relay` with the turn's next ones and leaves with
        them — a ``NOTIFY`` on ``turnstile_chunk`` per payload, one transaction per batch —
        within :data:`~stores.chunk_relay.RELAY_INTERVAL`, and always before the turn's next
        status change (see :meth:`transition`). Every listening process receives it; only
        subscribers of the turn keep it.
        """
        await self.relay.publish(turn_id, chunk)

    async def _notify_chunks(self, payloads: list[str]) -> None:
        # One pipeline with one sync: the batch's payloads commit together, in order.
        await self._pg.fetch_together([(_NOTIFY_CHUNKS, {"payload": p}) for p in payloads])

    @contextlib.asynccontextmanager
    async def _subscribe(self, turn_id: str) -> AsyncIterator[ChunkSubscription]:
        async with self._chunks.subscribe(turn_id) as subscription:
            # Chunks published before our LISTEN is up would be lost: wait for it (briefly;
            # with the database down the turn cannot start either).
            await self._listener.wait_connected(timeout=5.0)
            yield subscription

    @contextlib.asynccontextmanager
    async def try_cluster_lock(self, name: str) -> AsyncIterator[bool]:
        """Hold a cluster-wide advisory lock while the block runs, if it is free; yields
        ``False`` (without waiting) when another process holds it."""
        async with self.db.advisory_lock(name) as got:
            yield got

    async def close(self) -> None:
        """See :meth:`engine.store.SessionStore.close`."""
        await self.relay.flush_all()
        await self._listener.close()
        await self._pg.close()
        await super().close()


class _ReadBack:
    """Snapshots of turns this process settles, read by the settle's own transaction for a
    caller here waiting on the turn, each for the first read of it that follows.

    The caller may be woken by the settle's notification before the settle's own answer
    arrives: its read then waits for the snapshot the settle is already reading. Kept
    briefly once read: the waiter reads at once, and a snapshot nobody took (its wait ended
    meanwhile) must not answer a read much later, when the turn's journal may have changed.
    """

    #: Seconds a snapshot is kept for its reader once the settle has read it.
    KEPT_FOR = 1.0
    #: Snapshots kept at most (the oldest goes first).
    LIMIT = 256

    def __init__(self) -> None:
        self._kept: dict[str, _Reading] = {}

    def expect(self, turn_id: str) -> _Reading:
        """Note that a settle of ``turn_id`` reads its snapshot back; its reader waits for
        it. The settle must :meth:`_Reading.done` it, with the snapshot or ``None``."""
        reading = _Reading(asyncio.get_running_loop().create_future())
        self._kept.pop(turn_id, None)
        self._kept[turn_id] = reading
        # Oldest first: drop what nobody took in time, and the oldest beyond the limit.
        while self._kept:
            oldest_id, oldest = next(iter(self._kept.items()))
            if len(self._kept) <= self.LIMIT and not oldest.stale(self.KEPT_FOR):
                break
            oldest.done(None)
            del self._kept[oldest_id]
        return reading

    async def take(self, turn_id: str) -> StoredSnapshot | None:
        """The snapshot read back for ``turn_id``, once: waited for while the settle reads
        it, ``None`` when there is none (or it is no longer fresh)."""
        reading = self._kept.pop(turn_id, None)
        if reading is None or reading.snapshot.get_loop() is not asyncio.get_running_loop():
            return None
        snapshot = await asyncio.shield(reading.snapshot)
        return None if reading.stale(self.KEPT_FOR) else snapshot


class _Reading:
    """One settle's read-back of its turn's snapshot."""

    def __init__(self, snapshot: asyncio.Future[StoredSnapshot | None]) -> None:
        self.snapshot = snapshot
        self.read_at: float | None = None

    def stale(self, kept_for: float) -> bool:
        """Whether the settle read it more than ``kept_for`` seconds ago."""
        return self.read_at is not None and time.monotonic() - self.read_at > kept_for

    def done(self, snapshot: StoredSnapshot | None) -> None:
        """The settle's snapshot (``None``: it failed, or read nothing)."""
        if not self.snapshot.done():
            self.read_at = time.monotonic()
            self.snapshot.set_result(snapshot)
