"""LISTEN/NOTIFY wake-ups (PostgreSQL); SQLite falls back to polling.

Notifications are hints, never the source of truth: waiters always re-read the row. Payloads
are turn ids (well under NOTIFY's 8,000-byte limit), sent inside the writing transaction so
they are delivered only if it commits; relayed chunks travel in batches of their own
(``stores/chunk_relay.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from engine.store.relay import ChunkBroker
from engine.store.signals import ChangeSubscription, ChangeSubscriptions, KeyedSignals, WakeEvent
from stores.chunk_relay import read_chunk_payload

__all__ = [
    "CHANGE_CHANNEL",
    "CHUNK_CHANNEL",
    "LISTEN_STATEMENT",
    "WORK_CHANNEL",
    "Listener",
    "notify",
]

logger = logging.getLogger("turnstile.notify")

#: A turn became claimable (created, or handed back for a retry).
WORK_CHANNEL = "turnstile_work"
#: A turn's status changed (settled, aborting, ...): payload is its id.
CHANGE_CHANNEL = "turnstile_turn"
#: Streamed chunks of a turn somebody watches: payload ``{"t": turn id, "n": number, "c":
#: [chunk, ...]}`` (see :func:`stores.chunk_relay.pack_chunks`).
CHUNK_CHANNEL = "turnstile_chunk"

#: What the listener runs once connected (also how an operator or a benchmark can tell, in
#: ``pg_stat_activity.query``, that a process is listening).
LISTEN_STATEMENT = f"LISTEN {WORK_CHANNEL}; LISTEN {CHANGE_CHANNEL}; LISTEN {CHUNK_CHANNEL}"

#: How many announced turn ids a listener keeps for :meth:`Listener.take_work_hints`. A pool
#: takes them at every wake-up, so only a pool busy for a long time fills this; past it the
#: hints are incomplete and the pool claims from the whole queue instead.
MAX_WORK_HINTS = 1_000


def notify(connection: Connection, channel: str, payload: str) -> None:
    """Queue a notification in the current transaction (no-op on SQLite)."""
    if connection.dialect.name == "postgresql":
        connection.execute(_NOTIFY, {"c": channel, "p": payload})


_NOTIFY = sa.text("SELECT pg_notify(:c, :p)")


class Listener:
    """One LISTEN connection per store and event loop, reconnecting when it drops.

    While it is down, waiters simply time out and re-check: polling is the fallback.
    """

    def __init__(self, url: URL, chunks: ChunkBroker | None = None) -> None:
        self._chunks = chunks or ChunkBroker()
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        # Sticky: set by a notification, cleared when a waiter wakes, so a notification that
        # lands between a worker's empty claim and its wait is not lost.
        self._work = WakeEvent()
        # The ids announced on the work channel since the last take_work_hints (a dict keeps
        # their order), and whether that set is complete (nothing missed since the last take).
        self._hints: dict[str, None] = {}
        self._hints_complete = True
        self._changes = KeyedSignals()
        # Tells every subscriber which turns were created or changed (the inbox UI's events).
        self._any_change = ChangeSubscriptions()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connected = asyncio.Event()

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._loop is not loop or self._task.done():
            self._loop = loop
            self._work = WakeEvent()
            self._hints, self._hints_complete = {}, False
            self._changes = KeyedSignals()
            self._any_change = ChangeSubscriptions()
            self.connected = asyncio.Event()
            self._task = loop.create_task(self._listen(), name="turnstile-listener")

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as connection:
                    await connection.execute(LISTEN_STATEMENT)  # one round trip for all
                    self.connected.set()
                    delay = 0.1
                    # Anything sent while we were disconnected is lost: wake every waiter so
                    # it re-reads the database now.
                    self._fire_all()
                    await self._receive(connection)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server restarted or our backend was terminated
                self.connected.clear()
                logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                self._fire_all()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _receive(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Dispatch notifications as they arrive, until the connection breaks (psycopg's
        ``notifies()`` raises then)."""
        async for note in connection.notifies():
            if note.channel == WORK_CHANNEL:
                self._hint(note.payload)
                self._any_change.fire(note.payload)
            elif note.channel == CHUNK_CHANNEL:
                self._relay(note.payload)
            else:
                self._changes.fire(note.payload)
                self._any_change.fire(note.payload)
        raise psycopg.OperationalError("the LISTEN connection was closed")

    def _hint(self, turn_id: str) -> None:
        if len(self._hints) < MAX_WORK_HINTS:
            self._hints[turn_id] = None
        else:
            self._hints_complete = False
        self._work.set()

    def take_work_hints(self) -> list[str] | None:
        """The turn ids announced on the work channel since the last call, or ``None`` if
        some may be missing (not yet connected, reconnected, or more than
        :data:`MAX_WORK_HINTS`). See :meth:`engine.store.SessionStore.take_work_hints`."""
        hints, complete = list(self._hints), self._hints_complete and self.connected.is_set()
        self._hints, self._hints_complete = {}, True
        return hints if complete else None

    def _relay(self, payload: str) -> None:
        if not self._chunks.has_subscribers:
            return  # the common case in a worker: nobody here watches any turn
        try:
            turn_id, chunks = read_chunk_payload(payload)
        except (ValueError, KeyError, TypeError):
            logger.warning("ignoring a malformed chunk notification")
            return
        for chunk in chunks:
            self._chunks.deliver(turn_id, chunk)

    async def wait_connected(self, timeout: float) -> None:
        """Start listening if needed and wait (up to ``timeout``) until LISTEN is active."""
        self._ensure_started()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), timeout)

    def _fire_all(self) -> None:
        # Notifications may have been lost: the next take must send pools to the whole queue.
        self._hints_complete = False
        self._work.set()
        self._changes.fire_all()
        self._any_change.fire(None)

    async def wait_for_work(self, timeout: float) -> None:
        """Until a work notification arrives, or ``timeout``."""
        self._ensure_started()
        await self._work.wait(timeout)
        self._work.clear()

    def waited_on_here(self, turn_id: str) -> bool:
        """Whether a waiter of this process waits for ``turn_id`` to change."""
        return (
            self._loop is not None
            and self._loop is asyncio.get_running_loop()
            and self._changes.waited_on(turn_id)
        )

    def changed_here(self, turn_id: str) -> None:
        """Wake this process's waiters for ``turn_id`` now: a change this process committed
        needs no round trip through the server to be heard here (its notification, sent
        for the other processes, wakes nobody left when it comes back)."""
        if self._loop is not None and self._loop is asyncio.get_running_loop():
            self._changes.fire(turn_id)

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """Until a change notification for ``turn_id`` arrives, or ``timeout``."""
        self._ensure_started()
        await self._changes.wait(turn_id, timeout)

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """A subscription to the ids of turns announced on the work and change channels
        (everything, after a reconnect); starts listening if needed."""
        self._ensure_started()
        return self._any_change.subscribe()

    async def close(self) -> None:
        """Stop listening."""
        if self._task is not None and self._loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
