"""``SqliteSessionStore``: the embedded store, each write one SQLAlchemy transaction.

SQLite has one writer at a time, so each transaction checks its rules in turn (the reference
forms in the aggregate modules) and raises the precise typed error. It has no notifications:
waiters poll at ``poll_interval``, and relayed chunks reach only this process's subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import sqlalchemy as sa

from engine.errors import InvalidArgumentError
from engine.store import (
    ClaimedTurn,
    InterruptAnswer,
    NewTurn,
    StoredSnapshot,
    Transition,
    TurnProgress,
    TurnRecord,
)
from engine.store.rules import check_answers, claim_after
from engine.store.signals import ChangeSubscription, ChangeSubscriptions
from stores import messages as message_sql
from stores import snapshots as snapshot_sql
from stores import tool_calls as call_sql
from stores import turn_claims as claim_sql
from stores import turn_creation as creation_sql
from stores import turns as turn_sql
from stores.pg import StatementRefused
from stores.sql import FencedWrite, SqlSessionStore, now_utc, round_and_transition_times

__all__ = ["SqliteSessionStore"]

#: What a creation returns: the turn, or the turn leased with its progress.
Created = TypeVar("Created", TurnRecord, ClaimedTurn)


class SqliteSessionStore(SqlSessionStore):
    """The :class:`SqlSessionStore` of an SQLite database (``SqlSessionStore(url)`` makes it
    for a ``sqlite://`` URL)."""

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.create_turn`."""
        return await self._creating(
            turn, answers, lambda c: creation_sql.create_turn(c, turn, answers, now_utc())
        )

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.create_claimed_turn`."""

        def create_and_lease(connection: sa.Connection) -> ClaimedTurn:
            now = now_utc()
            created = creation_sql.create_turn(connection, turn, answers, now)
            lease = claim_sql.ClaimRequest(
                owner=owner, lease_seconds=lease_seconds, now=now, limit=1
            )
            return claim_sql.lease_created(connection, created, lease)

        return await self._creating(turn, answers, create_and_lease)

    async def _creating(
        self,
        turn: NewTurn,
        answers: Sequence[InterruptAnswer],
        create: Callable[[sa.Connection], Created],
    ) -> Created:
        """Run ``create`` in a write transaction, with the checks and the definition every
        creation needs first and SQLite's refusal of a taken id named."""
        check_answers(turn, answers)
        await self._keep_definition(turn)
        try:
            return await self._write(create)
        except StatementRefused as exc:
            # SQLite names no constraint; the only key a creation can repeat is the turn's.
            if exc.sqlite_error == "SQLITE_CONSTRAINT_PRIMARYKEY":
                raise InvalidArgumentError(f"Turn {turn.id} already exists.") from exc
            raise

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.get_turn`."""
        return await self._read(lambda c: turn_sql.get_turn(c, turn_id))

    async def _claim(self, request: claim_sql.ClaimRequest) -> list[ClaimedTurn]:
        return await self._write(lambda c: claim_sql.claim(c, request))

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.transition`."""

        def move(connection: sa.Connection) -> TurnRecord:
            saved_at, now = round_and_transition_times()
            if change.usage is not None:
                # First, so the row the transition returns carries the new totals; a refused
                # transition rolls it back with everything else.
                turn_sql.add_usage(connection, turn_id, change.usage)
            # The transition locks the turn's row and checks the lease token first, so the
            # round below is written only by the lease holder, as save_round's fence ensures.
            found, moved = turn_sql.transition_from(connection, turn_id, change, now)
            if change.round is not None and change.round.state is not None:
                turn_sql.set_state(connection, turn_id, [change.round])
                moved = turn_sql.get_turn(connection, turn_id) or moved
            if change.round is not None:
                message_sql.save_round(connection, turn_id, change.round, saved_at)
            call_sql.upsert_calls(
                connection, turn_id, change.calls, saved_at, worker=found.lease_owner
            )
            return moved

        moved = await self._write(move)
        if change.then_claim is not None:
            await claim_after(self, change.then_claim)
        return moved

    async def _save_fenced(self, write: FencedWrite) -> None:
        turn_id = write.turn_id

        def save(connection: sa.Connection) -> None:
            now = now_utc()
            if write.usage is not None:
                # First, so the turn row is locked exclusively before the fence's share lock:
                # upgrading share to exclusive could deadlock with a concurrent heartbeat.
                turn_sql.add_usage(connection, turn_id, write.usage)
            worker = turn_sql.fence(connection, turn_id, write.lease_token)
            turn_sql.set_state(connection, turn_id, [write.earlier, write.round])
            for written in (write.earlier, write.round):
                if written is not None:
                    message_sql.save_round(connection, turn_id, written, now)
            call_sql.upsert_calls(connection, turn_id, write.calls, now, worker=worker)

        await self._write(save)

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """See :meth:`engine.store.SessionStore.read_progress`."""
        return await self._read(lambda c: snapshot_sql.read_progress(c, turn_id))

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """See :meth:`engine.store.SessionStore.read_snapshot`."""
        return await self._read(lambda c: snapshot_sql.read_snapshot(c, turn_id))

    # -- wake-ups: polling ------------------------------------------------------------

    async def wait_for_work(self, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_work`."""
        await asyncio.sleep(min(timeout, self.poll_interval))

    def take_work_hints(self) -> list[str] | None:
        """See :meth:`engine.store.SessionStore.take_work_hints` (no hints: polling)."""
        return None

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_change`."""
        await asyncio.sleep(min(timeout, self.poll_interval))

    #: No notifications: other processes' changes are only seen by polling.
    live_changes = False

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """See :meth:`engine.store.ChangeFeed.watch_changes`: a subscription that hears
        nothing (SQLite cannot announce changes, so callers poll)."""
        return ChangeSubscriptions().subscribe()

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """See :meth:`engine.store.SessionStore.publish_chunk`: only subscribers in this
        process (e.g. ``turnstile serve --workers``) see it."""
        self._chunks.deliver(turn_id, chunk)

    @contextlib.asynccontextmanager
    async def try_cluster_lock(self, name: str) -> AsyncIterator[bool]:
        """Always ``True``: SQLite has one writer at a time anyway."""
        yield True
